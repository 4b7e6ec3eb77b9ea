//! [`JsonText`]: a JSON document carried as its text.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::JsonError;

/// A JSON document as text. Over JSON (HTTP, WebSocket, gRPC) it is the
/// document itself; over bincode (calls between managers) it is its text,
/// because bincode cannot carry a self-describing value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsonText(String);

impl JsonText {
    /// `value` as JSON.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, JsonError> {
        serde_json::to_string(value)
            .map(JsonText)
            .map_err(JsonError::Encode)
    }

    /// Takes `text` as it is, after checking that it is one JSON document.
    pub fn parse(text: impl Into<String>) -> Result<JsonText, JsonError> {
        let text = text.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&text).map_err(JsonError::NotJson)?;
        Ok(JsonText(text))
    }

    /// JSON `null`.
    pub fn null() -> JsonText {
        JsonText("null".to_owned())
    }

    /// The value as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// The value stored under `key` as `T`; an error that names the key
    /// and the type when it is not one.
    pub fn decode_stored<T: DeserializeOwned>(&self, key: &str) -> Result<T, JsonError> {
        self.decode().map_err(|source| JsonError::Mismatch {
            key: key.to_owned(),
            type_name: std::any::type_name::<T>(),
            source,
        })
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Length of the JSON text in bytes (what the Store's size limit counts).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the text is empty (never, for a parsed document).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The JSON text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl Default for JsonText {
    fn default() -> Self {
        JsonText::null()
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            let value: serde_json::Value =
                serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
            value.serialize(serializer)
        } else {
            serializer.serialize_str(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let value = serde_json::Value::deserialize(deserializer)?;
            Ok(JsonText(value.to_string()))
        } else {
            let text = String::deserialize(deserializer)?;
            serde_json::from_str::<serde::de::IgnoredAny>(&text)
                .map_err(|e| serde::de::Error::custom(format!("not a JSON document: {e}")))?;
            Ok(JsonText(text))
        }
    }
}

/// Any JSON value, as the API description says of it.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for JsonText {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "JsonValue".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_another_type_names_the_key_and_the_type() {
        let err = JsonText::encode("text")
            .unwrap()
            .decode_stored::<u64>("n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`n`") && err.contains("u64"), "{err}");
    }

    #[test]
    fn text_that_is_not_json_is_refused() {
        assert!(matches!(JsonText::parse("{"), Err(JsonError::NotJson(_))));
        assert_eq!(JsonText::parse(" [1] ").unwrap().as_str(), " [1] ");
    }
}
