//! The `grpc-timeout` request header (gRPC over HTTP/2: "TimeoutValue
//! TimeoutUnit", at most 8 ASCII digits and one of `H M S m u n`): the
//! client's deadline, which becomes the call's event deadline, tighter of
//! it and the listener's `request_timeout_ms`
//! (docs/decisions/0093-grpc-timeout-is-the-deadline.md).

use std::time::Duration;

use http::HeaderMap;
use switchyard_proto::grpc::CallRequest;

/// The header's name.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// A call's deadline as its client sent it, kept in the request's
/// extensions for the service that turns the call into an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClientDeadline(pub(crate) Duration);

/// The client's deadline, `None` without the header; the error says what
/// is wrong with a malformed one.
pub(crate) fn parse(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    let mut values = headers.get_all(GRPC_TIMEOUT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("grpc-timeout appears more than once".to_owned());
    }
    let bad = || {
        format!(
            "malformed grpc-timeout {:?}: 1 to 8 digits and a unit (H, M, S, m, u or n)",
            String::from_utf8_lossy(value.as_bytes())
        )
    };
    let bytes = value.as_bytes();
    let Some((&unit, digits)) = bytes.split_last() else {
        return Err(bad());
    };
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    // At most 8 digits: no overflow below.
    let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let timeout = match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some(timeout))
}

/// Applies the client's deadline to a call: the tighter of it and the
/// call's own `deadline_ms` (the listener's limit applies after). Rounded
/// up to a whole millisecond, so that a deadline under one (or zero) is
/// one that passes at once, never "none".
pub(crate) fn tighten(request: &mut CallRequest, client: Option<&ClientDeadline>) {
    let Some(ClientDeadline(timeout)) = client else {
        return;
    };
    let ms = u64::try_from(timeout.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1);
    request.deadline_ms = match request.deadline_ms {
        0 => ms,
        own => own.min(ms),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(value: &str) -> Result<Option<Duration>, String> {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_TIMEOUT, value.parse().unwrap());
        parse(&headers)
    }

    #[test]
    fn the_spec_units() {
        assert_eq!(parse(&HeaderMap::new()), Ok(None));
        assert_eq!(of("100m"), Ok(Some(Duration::from_millis(100))));
        assert_eq!(of("2S"), Ok(Some(Duration::from_secs(2))));
        assert_eq!(of("3M"), Ok(Some(Duration::from_secs(180))));
        assert_eq!(of("1H"), Ok(Some(Duration::from_secs(3600))));
        assert_eq!(of("250u"), Ok(Some(Duration::from_micros(250))));
        assert_eq!(of("99999999n"), Ok(Some(Duration::from_nanos(99_999_999))));
        assert_eq!(of("0m"), Ok(Some(Duration::ZERO)));
        assert_eq!(of("99999999H"), Ok(Some(Duration::from_secs(99_999_999 * 3600))));
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "m",
            "100",
            "100ms",
            "1.5S",
            "-1S",
            "123456789m",
            " 1S",
            "1s",
            "1Sx",
            "١S",
        ] {
            let mut headers = HeaderMap::new();
            match bad.parse() {
                Ok(value) => {
                    headers.insert(GRPC_TIMEOUT, value);
                }
                Err(_) => continue,
            }
            assert!(parse(&headers).is_err(), "{bad:?} accepted");
        }
        let mut twice = HeaderMap::new();
        twice.append(GRPC_TIMEOUT, "1S".parse().unwrap());
        twice.append(GRPC_TIMEOUT, "2S".parse().unwrap());
        assert!(parse(&twice).is_err());
    }

    #[test]
    fn the_tighter_deadline_wins() {
        let call = |deadline_ms| CallRequest {
            deadline_ms,
            ..CallRequest::default()
        };
        let client = |d| Some(ClientDeadline(d));
        let mut none = call(0);
        tighten(&mut none, None);
        assert_eq!(none.deadline_ms, 0);
        let mut header_only = call(0);
        tighten(&mut header_only, client(Duration::from_millis(100)).as_ref());
        assert_eq!(header_only.deadline_ms, 100);
        let mut own_tighter = call(50);
        tighten(&mut own_tighter, client(Duration::from_millis(100)).as_ref());
        assert_eq!(own_tighter.deadline_ms, 50);
        let mut header_tighter = call(5_000);
        tighten(&mut header_tighter, client(Duration::from_millis(100)).as_ref());
        assert_eq!(header_tighter.deadline_ms, 100);
        let mut zero = call(0);
        tighten(&mut zero, client(Duration::ZERO).as_ref());
        assert_eq!(zero.deadline_ms, 1, "a passed deadline is not `none`");
        let mut micros = call(0);
        tighten(&mut micros, client(Duration::from_micros(1_500)).as_ref());
        assert_eq!(micros.deadline_ms, 2);
    }
}
