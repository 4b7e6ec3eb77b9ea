//! Building a typed event from a request: path parameters, query string and
//! JSON body merged into one object, then deserialized with string → number
//! and string → bool coercion (path and query values are always text), with
//! the failing field's path reported (`serde_path_to_error`).

use serde::de::{self, DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use serde_json::{Map, Value};

use crate::reply::{Error, FieldError};

/// Deserializes `T` from `value`, coercing text where `T` wants a number or
/// a bool. A mismatch is a 422 that names the field.
pub(crate) fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(Coerce(value)).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        // A missing field fails on its parent (the path ends before it):
        // serde names it only in the message.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name);
        let field = match (path.as_str(), missing) {
            (".", Some(name)) => name.to_owned(),
            (".", None) => String::new(),
            (parent, Some(name)) => format!("{parent}.{name}"),
            (path, None) => path.to_owned(),
        };
        Error::invalid(vec![FieldError { field, message }])
    })
}

/// Merges query pairs, a JSON-object body and path parameters, later ones
/// winning: the route, not the client, decides a path parameter.
pub(crate) fn merge<'a>(
    query: impl Iterator<Item = (&'a str, &'a str)>,
    body: Option<Map<String, Value>>,
    path: impl Iterator<Item = (&'a str, &'a str)>,
) -> Value {
    let mut object = Map::new();
    for (k, v) in query {
        object.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    if let Some(body) = body {
        object.extend(body);
    }
    for (k, v) in path {
        object.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    Value::Object(object)
}

struct Coerce<'a>(&'a Value);

type E = serde_json::Error;

macro_rules! coerce_number {
    ($($method:ident => $visit:ident : $ty:ty),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
            match self.0 {
                Value::String(s) => match s.trim().parse::<$ty>() {
                    Ok(n) => visitor.$visit(n),
                    Err(_) => Err(de::Error::invalid_value(de::Unexpected::Str(s), &visitor)),
                },
                other => other.$method(visitor),
            }
        }
    )*};
}

/// 2^53: below it every integer is an exact `f64`, and no other integer
/// rounds to one (2^53 + 1 parses as 2^53).
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// As [`coerce_number`], and a JSON number with no fractional part
/// (`300.0`) is that integer: JSON Schema's `integer` (what the API
/// description says of these fields) is any such number, and JSON has no
/// other kind; `300.5` or one out of the type's range is still refused.
macro_rules! coerce_integer {
    ($($method:ident => $visit:ident : $ty:ty),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
            match self.0 {
                Value::String(s) => match s.trim().parse::<$ty>() {
                    Ok(n) => visitor.$visit(n),
                    Err(_) => Err(de::Error::invalid_value(de::Unexpected::Str(s), &visitor)),
                },
                Value::Number(n) if n.is_f64() => {
                    let f = n.as_f64().unwrap_or(f64::NAN);
                    // Below 2^53 a whole f64 is the integer the client
                    // wrote; from it on, it may be a neighbour (JSON text
                    // for i64::MIN - 1 parses as i64::MIN's f64).
                    let whole = (f.fract() == 0.0 && f.abs() < MAX_EXACT)
                        .then(|| <$ty>::try_from(f as i128).ok())
                        .flatten();
                    match whole {
                        Some(n) => visitor.$visit(n),
                        None => Err(de::Error::invalid_value(de::Unexpected::Float(f), &visitor)),
                    }
                }
                other => other.$method(visitor),
            }
        }
    )*};
}

macro_rules! delegate {
    ($($method:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
            self.0.$method(visitor)
        }
    )*};
}

impl<'de> Deserializer<'de> for Coerce<'de> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Seq(items.iter())),
            Value::Object(map) => visitor.visit_map(MapAccess {
                iter: map.iter(),
                value: None,
            }),
            other => other.deserialize_any(visitor),
        }
    }

    coerce_integer! {
        deserialize_u8 => visit_u8: u8, deserialize_u16 => visit_u16: u16,
        deserialize_u32 => visit_u32: u32, deserialize_u64 => visit_u64: u64,
        deserialize_i8 => visit_i8: i8, deserialize_i16 => visit_i16: i16,
        deserialize_i32 => visit_i32: i32, deserialize_i64 => visit_i64: i64,
        deserialize_u128 => visit_u128: u128, deserialize_i128 => visit_i128: i128,
    }

    coerce_number! {
        deserialize_f32 => visit_f32: f32, deserialize_f64 => visit_f64: f64,
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::String(s) => match s.as_str() {
                "true" | "1" | "yes" | "on" => visitor.visit_bool(true),
                "false" | "0" | "no" | "off" => visitor.visit_bool(false),
                _ => Err(de::Error::invalid_value(de::Unexpected::Str(s), &visitor)),
            },
            other => other.deserialize_bool(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, E> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Seq(items.iter())),
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, E> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, E> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(MapAccess {
                iter: map.iter(),
                value: None,
            }),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, E> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, E> {
        self.0.clone().deserialize_enum(name, variants, visitor)
    }

    delegate! {
        deserialize_char, deserialize_str, deserialize_string, deserialize_bytes,
        deserialize_byte_buf, deserialize_unit, deserialize_identifier, deserialize_ignored_any,
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, E> {
        self.0.deserialize_unit_struct(name, visitor)
    }
}

struct Seq<'a>(std::slice::Iter<'a, Value>);

impl<'de> de::SeqAccess<'de> for Seq<'de> {
    type Error = E;
    fn next_element_seed<T: de::DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, E> {
        self.0.next().map(|v| seed.deserialize(Coerce(v))).transpose()
    }
}

struct MapAccess<'a> {
    iter: serde_json::map::Iter<'a>,
    value: Option<&'a Value>,
}

impl<'de> de::MapAccess<'de> for MapAccess<'de> {
    type Error = E;
    fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, E> {
        match self.iter.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(k.as_str().into_deserializer()).map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, E> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("value without a key"))?;
        seed.deserialize(Coerce(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Item {
        id: u64,
        name: String,
        flag: bool,
        ratio: Option<f64>,
        tags: Vec<String>,
    }

    #[test]
    fn strings_become_numbers_and_bools_where_wanted() {
        let v = merge(
            [("flag", "true"), ("ratio", "0.5"), ("id", "999")].into_iter(),
            Some(serde_json::from_str(r#"{"name": "123", "tags": ["a"]}"#).unwrap()),
            [("id", "42")].into_iter(),
        );
        let item: Item = from_value(&v).unwrap();
        assert_eq!(
            item,
            Item {
                id: 42,
                name: "123".into(),
                flag: true,
                ratio: Some(0.5),
                tags: vec!["a".into()]
            }
        );
    }

    #[test]
    fn errors_name_the_field() {
        let v = merge([("id", "x")].into_iter(), None, std::iter::empty());
        let err = from_value::<Item>(&v).unwrap_err();
        assert_eq!(err.status, 422);
        assert_eq!(err.errors[0].field, "id", "{err:?}");
        let v = merge([("id", "1"), ("flag", "1")].into_iter(), None, std::iter::empty());
        let err = from_value::<Item>(&v).unwrap_err();
        assert!(err.errors[0].message.contains("missing field `name`"), "{err:?}");
        assert_eq!(err.errors[0].field, "name", "a missing field is named: {err:?}");
    }

    #[test]
    fn a_whole_float_is_an_integer_and_a_fraction_is_not() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct Ints {
            a: u64,
            b: i8,
            #[serde(default)]
            c: i64,
        }
        let ints = |json: &str| from_value::<Ints>(&serde_json::from_str(json).unwrap());
        assert_eq!(
            ints(r#"{"a": 300.0, "b": -3.0}"#).unwrap(),
            Ints { a: 300, b: -3, c: 0 }
        );
        assert_eq!(
            ints(r#"{"a": 1e3, "b": 0}"#).unwrap(),
            Ints { a: 1000, b: 0, c: 0 }
        );
        for bad in [
            r#"{"a": 300.5, "b": 1}"#,
            r#"{"a": -1.0, "b": 1}"#,
            r#"{"a": 1, "b": 128.0}"#,
            r#"{"a": 1.8446744073709552e19, "b": 1}"#,
            r#"{"a": 1e300, "b": 1}"#,
            // From 2^53 on a float may not be the integer the client wrote.
            r#"{"a": 9007199254740993.0, "b": 1}"#,
            r#"{"a": 1, "b": 1, "c": -9223372036854775809}"#,
        ] {
            let err = ints(bad).unwrap_err();
            assert_eq!(err.status, 422, "{bad}: {err:?}");
        }
    }
}

/// Property tests (decision 0099): whatever a client puts in the query, the
/// path and a JSON body, extraction answers a value or a 422 naming a
/// field; it never panics, and text that spells a number or a bool is
/// taken as one where the event wants it.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only decoded
    enum Kind {
        A,
        B(u8),
        C { x: i16 },
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only decoded
    struct Inner {
        n: i32,
        s: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only decoded
    struct Event {
        id: u64,
        small: u8,
        signed: i64,
        ratio: f64,
        flag: bool,
        name: String,
        maybe: Option<u32>,
        #[serde(default)]
        tags: Vec<u16>,
        inner: Option<Inner>,
        kind: Option<Kind>,
        pair: Option<(u8, String)>,
        #[serde(default)]
        map: std::collections::BTreeMap<String, i8>,
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "(-?[0-9]{1,20}(\\.[0-9]{0,4})?|true|false|A|B|C|\\PC{0,8})".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("(n|s|x|A|B|C|[a-z]{1,3})", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn field() -> impl Strategy<Value = String> {
        "(id|small|signed|ratio|flag|name|maybe|tags|inner|kind|pair|map|[a-z]{1,5})"
    }

    fn text() -> impl Strategy<Value = String> {
        "(-?[0-9]{1,22}(\\.[0-9]{0,6})?(e[0-9]{1,3})?|true|false|1|0|\\PC{0,12})"
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 768, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_request_extracts_or_names_a_field(
            query in prop::collection::vec((field(), text()), 0..8),
            body in prop::option::of(prop::collection::btree_map(field(), json(), 0..10)),
            path in prop::collection::vec((field(), text()), 0..3),
        ) {
            let merged = merge(
                query.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                body.map(|b| b.into_iter().collect()),
                path.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
            if let Err(err) = from_value::<Event>(&merged) {
                prop_assert_eq!(err.status, 422);
                prop_assert!(!err.errors.is_empty());
            }
        }

        #[test]
        fn numbers_and_bools_spelled_as_text_are_taken(
            id in any::<u64>(), small in any::<u8>(), signed in any::<i64>(), flag in any::<bool>(),
        ) {
            let (id, small, signed, flag) = (id.to_string(), small.to_string(), signed.to_string(), flag.to_string());
            let merged = merge(
                [("small", small.as_str()), ("signed", signed.as_str()), ("ratio", "0.25"), ("flag", flag.as_str()),
                 ("name", "n")].into_iter(),
                None,
                [("id", id.as_str())].into_iter(),
            );
            let event = from_value::<Event>(&merged).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(event.id.to_string(), id);
            prop_assert_eq!(event.small.to_string(), small);
            prop_assert_eq!(event.signed.to_string(), signed);
            prop_assert_eq!(event.flag.to_string(), flag);
        }
    }
}
