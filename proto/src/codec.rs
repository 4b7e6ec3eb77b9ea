//! The bincode codec. Every bincode call in the workspace goes through here.
//!
//! bincode is pinned to `=2.0.1` (see docs/decisions/0001-bincode.md): 3.0.0
//! on crates.io is an empty tombstone and upstream is unmaintained
//! (RUSTSEC-2025-0141). Keeping it behind this module means a compatible
//! successor replaces one file. Decoding is always bounded so that a hostile
//! or corrupt length inside a frame cannot make us allocate without limit.

use serde::{Serialize, de::DeserializeOwned};

use crate::{Error, Result};

/// Upper bound on what one decode may allocate; frames are bounded separately.
pub const DECODE_LIMIT: usize = 64 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// Appends the encoding of `value` to `out`.
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    bincode::serde::encode_into_std_write(value, out, config())
        .map(|_| ())
        .map_err(|e| Error::Encode(e.to_string()))
}

/// Encodes `value` into a fresh buffer.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Decodes one value from the start of `bytes`, strings and byte buffers
/// taken from the input ([`borrowing`]): a length that claims more than the
/// input holds fails before anything is allocated for it.
fn decode_borrowing<T: DeserializeOwned, C: bincode::config::Config>(
    bytes: &[u8],
    config: C,
) -> Result<(T, usize)> {
    bincode::serde::seed_decode_from_slice(borrowing::Root::<T>::default(), bytes, config)
        .map_err(|e| Error::Decode(e.to_string()))
}

/// Decodes a value produced by this group's own code inside one process (the
/// plugin boundary), where the size was bounded before encoding: the limit
/// only guards against a corrupt length, so it is the address space's.
pub fn decode_local<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let config = bincode::config::standard().with_limit::<{ 1 << 40 }>();
    let (value, used) = decode_borrowing(bytes, config)?;
    if used != bytes.len() {
        return Err(Error::Decode(format!(
            "{} trailing bytes after value",
            bytes.len() - used
        )));
    }
    Ok(value)
}

/// Decodes one value that must fill `bytes` exactly.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (value, used) = decode_borrowing(bytes, config())?;
    if used != bytes.len() {
        return Err(Error::Decode(format!(
            "{} trailing bytes after value",
            bytes.len() - used
        )));
    }
    Ok(value)
}

mod borrowing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let v = (42u64, String::from("hello"), vec![1u8, 2, 3]);
        let bytes = encode(&v).unwrap();
        let back: (u64, String, Vec<u8>) = decode(&bytes).unwrap();
        assert_eq!(v, back);
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut bytes = encode(&7u32).unwrap();
        bytes.push(0);
        assert!(decode::<u32>(&bytes).is_err());
    }

    #[test]
    fn huge_declared_length_is_refused_not_allocated() {
        // A varint length of u64::MAX for a Vec<u8>: must fail on the limit.
        let bytes = [253u8, 255, 255, 255, 255, 255, 255, 255, 255];
        let err = decode::<Vec<u8>>(&bytes).unwrap_err();
        assert!(matches!(err, Error::Decode(_)), "{err}");
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        for len in 0..512 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = decode::<crate::control::Control>(&bytes);
            let _ = decode::<(u64, String, Vec<(String, String)>)>(&bytes);
        }
    }
}
