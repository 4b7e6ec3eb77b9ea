//! The `routing` scenario's rig for a fraction of a second: the real router
//! and two fake managers complete round trips. No timing thresholds.

use std::time::Duration;

use switchyard_bench::suite::routing;

#[test]
fn round_trips_flow_through_the_real_router() {
    for window in [1, 16] {
        let run = routing::measure(window, Duration::from_millis(50), Duration::from_millis(200)).unwrap();
        assert_eq!(run.window, window);
        assert!(run.round_trips > 0, "{run:?}");
        assert!(run.per_second() > 0.0);
        assert!(run.p50_us.is_some() && run.p99_us.is_some(), "{run:?}");
    }
}
