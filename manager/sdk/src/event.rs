//! Event types and how a request becomes one.

use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_proto::{Meta, codec};

use crate::extract;
use crate::reply::{BINCODE, Error, FieldError};

/// An event type a manager can receive or send. Derive it:
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use switchyard_manager::Event;
///
/// #[derive(Serialize, Deserialize, Event)]
/// #[event(name = "shop.GetItem", http = "GET /items/{id}")]
/// struct GetItem {
///     #[validate(range(min = 1))]
///     id: u64,
///     #[validate(length(max = 8))]
///     lang: Option<String>,
/// }
/// assert_eq!(GetItem::ROUTE, Some(("GET", "/items/{id}")));
/// ```
pub trait Event: DeserializeOwned + Serialize + 'static {
    /// Stable type name, e.g. `shop.Checkout`; interned to the routing id.
    const NAME: &'static str;
    /// The HTTP route that produces this event: `("GET", "/items/{id}")`.
    const ROUTE: Option<(&'static str, &'static str)> = None;

    /// Builds the event from a request. From another manager: the bincode
    /// body. From HTTP: the fields of a JSON-object body, the query string
    /// and the path parameters, merged (path wins, then body, then query),
    /// with text coerced to numbers and bools where the field wants them.
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        if request.is_bincode() {
            return request.body_as();
        }
        let body = if request.body.is_empty() {
            None
        } else {
            match request.json_value()? {
                serde_json::Value::Object(map) => Some(map),
                _ => return Err(Error::unprocessable("the request body must be a JSON object")),
            }
        };
        let merged = extract::merge(request.query(), body, request.path_params());
        extract::from_value(&merged)
    }

    /// Checks the values after decoding; the derive generates it from
    /// `#[validate(...)]` field attributes.
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }
}

/// A request as extraction sees it: the event's meta and body.
pub struct Request<'a> {
    pub meta: &'a Meta,
    pub body: &'a [u8],
    query: Vec<(String, String)>,
}

impl<'a> Request<'a> {
    pub fn new(meta: &'a Meta, body: &'a [u8]) -> Self {
        let query = meta
            .get("query")
            .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
            .unwrap_or_default();
        Request { meta, body, query }
    }

    /// Whether the body is bincode (a call from another manager).
    pub fn is_bincode(&self) -> bool {
        self.meta.get("content-type") == Some(BINCODE)
    }

    /// The path parameters, `("name", "Ada")` for `/hello/{name}`.
    pub fn path_params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.meta
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("p.").map(|k| (k, v)))
    }

    /// One path parameter.
    pub fn path_param(&self, name: &str) -> Option<&str> {
        self.path_params().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// The decoded query pairs.
    pub fn query(&self) -> impl Iterator<Item = (&str, &str)> {
        self.query.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// A request header the listener passed on (`content-type`, `accept`).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.meta.get(name)
    }

    fn json_value(&self) -> Result<serde_json::Value, Error> {
        serde_json::from_slice(self.body)
            .map_err(|e| Error::bad_request(format!("body is not valid JSON: {e}")))
    }

    /// The whole body as `T`: bincode from a manager, JSON otherwise. 400 for
    /// malformed bytes, 422 naming the field when they do not fit `T`.
    pub fn body_as<T: DeserializeOwned>(&self) -> Result<T, Error> {
        if self.is_bincode() {
            return codec::decode(self.body)
                .map_err(|e| Error::bad_request(format!("bad bincode body: {e}")));
        }
        extract::from_value(&self.json_value()?)
    }
}

/// Validation failures, collected field by field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invalid(pub Vec<FieldError>);

impl Invalid {
    pub fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_owned(),
            message: message.into(),
        });
    }
    pub fn into_result(self) -> Result<(), Invalid> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Error {
        Error::invalid(invalid.0)
    }
}

/// The checks `#[validate(...)]` expands to.
pub mod validate {
    use super::Invalid;

    /// Something with a length: strings (in characters), collections.
    pub trait HasLength {
        fn length(&self) -> usize;
        /// What the length counts, singular and plural, for messages.
        const UNIT: (&'static str, &'static str) = ("item", "items");
    }
    impl HasLength for String {
        fn length(&self) -> usize {
            self.chars().count()
        }
        const UNIT: (&'static str, &'static str) = ("character", "characters");
    }
    impl HasLength for str {
        fn length(&self) -> usize {
            self.chars().count()
        }
        const UNIT: (&'static str, &'static str) = ("character", "characters");
    }
    impl<T> HasLength for Vec<T> {
        fn length(&self) -> usize {
            self.len()
        }
    }

    fn count<T: HasLength + ?Sized>(n: usize) -> String {
        let (one, many) = T::UNIT;
        format!("{n} {}", if n == 1 { one } else { many })
    }

    /// A value that may be absent; absent values pass every check.
    pub trait Present<T: ?Sized> {
        fn present(&self) -> Option<&T>;
    }
    impl<T: HasLength + ?Sized> Present<T> for T {
        fn present(&self) -> Option<&T> {
            Some(self)
        }
    }
    impl<T: HasLength> Present<T> for Option<T> {
        fn present(&self) -> Option<&T> {
            self.as_ref()
        }
    }

    pub fn length<T: HasLength + ?Sized, P: Present<T> + ?Sized>(
        invalid: &mut Invalid,
        field: &str,
        value: &P,
        min: Option<usize>,
        max: Option<usize>,
    ) {
        let Some(value) = value.present() else { return };
        let n = value.length();
        if let Some(min) = min.filter(|&m| n < m) {
            if min == 1 {
                invalid.add(field, "must not be empty");
            } else {
                invalid.add(field, format!("must have at least {} (has {n})", count::<T>(min)));
            }
        }
        if let Some(max) = max.filter(|&m| n > m) {
            invalid.add(field, format!("must have at most {} (has {n})", count::<T>(max)));
        }
    }

    /// A number (or an `Option` of one) within bounds.
    pub trait InRange {
        fn as_f64(&self) -> Option<f64>;
    }
    macro_rules! in_range {
        ($($t:ty),*) => {$(
            impl InRange for $t {
                fn as_f64(&self) -> Option<f64> { Some(*self as f64) }
            }
            impl InRange for Option<$t> {
                fn as_f64(&self) -> Option<f64> { self.map(|v| v as f64) }
            }
        )*};
    }
    in_range!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64);

    pub fn range<T: InRange, B: Into<f64>>(
        invalid: &mut Invalid,
        field: &str,
        value: &T,
        min: Option<B>,
        max: Option<B>,
    ) {
        let Some(v) = value.as_f64() else { return };
        if let Some(min) = min.map(Into::into).filter(|&m| v < m) {
            invalid.add(field, format!("must be at least {min}"));
        }
        if let Some(max) = max.map(Into::into).filter(|&m| v > m) {
            invalid.add(field, format!("must be at most {max}"));
        }
    }
}
