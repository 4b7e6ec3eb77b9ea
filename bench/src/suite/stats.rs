//! Summaries over the rounds of a scenario: the median and the range of a
//! figure, and the ratio of two medians.

/// The median and the range of a figure over the runs that measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The median, minimum and maximum of `values`; `None` when there are none.
/// NaN (a figure a run could not produce) is left out rather than allowed to
/// poison the order.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    let (&min, &max) = (sorted.first()?, sorted.last()?);
    let mid = sorted.len() / 2;
    // An even count has two middles: their mean, as run_rest.sh computes it.
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    };
    Some(Spread { median, min, max })
}

/// [`spread`]'s median alone.
pub fn median(values: &[f64]) -> Option<f64> {
    spread(values).map(|s| s.median)
}

/// `a / b`, or `None` when the quotient would mean nothing (no `b`, a `b` of
/// zero, or a figure that is not finite).
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b > 0.0 && a.is_finite() && r.is_finite()).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range() {
        assert_eq!(spread(&[]), None);
        assert_eq!(
            spread(&[5.0]),
            Some(Spread {
                median: 5.0,
                min: 5.0,
                max: 5.0
            })
        );
        assert_eq!(
            spread(&[3.0, 1.0, 2.0]),
            Some(Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        // Even count: mean of the two middle values.
        assert_eq!(median(&[4.0, 1.0, 3.0, 10.0]), Some(3.5));
        // NaN is ignored, not sorted somewhere arbitrary.
        assert_eq!(median(&[f64::NAN, 7.0, 1.0, 4.0]), Some(4.0));
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(1.0, 4.0), Some(0.25));
        assert_eq!(ratio(0.0, 4.0), Some(0.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(1.0, -2.0), None);
        assert_eq!(ratio(f64::NAN, 2.0), None);
        assert_eq!(ratio(f64::INFINITY, 2.0), None);
    }
}
