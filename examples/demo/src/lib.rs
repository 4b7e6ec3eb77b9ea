//! The demo application: what `switchyard up` serves with no configuration.
//!
//! A plugin library with two managers, so that the group shows routing
//! between processes: `basics` answers `/noop`, `/echo`, `/hello/{name}` and
//! `/panic`; `payload` answers `/payload/{size}` and `/sleep/{ms}` (which
//! blocks the manager: a stand-in for slow work until worker pools exist).
//! The `switchyard` binary links this crate in; it is also built as a
//! `cdylib` and loads like any other plugin.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use switchyard_manager::{Binary, Config, Context, Error, Event, Json, Manager, Registry, Reply, Request};

/// `GET /noop` → `{"ok":true}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Noop", http = "GET /noop")]
pub struct Noop {}

/// `POST /echo` → the JSON body, echoed.
#[derive(Deserialize, Serialize)]
pub struct Echo(pub serde_json::Value);

impl Event for Echo {
    const NAME: &'static str = "demo.Echo";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("POST", "/echo"));
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        request.body_as().map(Echo)
    }
}

/// `GET /hello/{name}` → `{"message":"Hello, NAME!"}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Hello", http = "GET /hello/{name}")]
pub struct Hello {
    #[validate(length(min = 1, max = 100))]
    pub name: String,
}

/// `GET /panic` → the handler panics; the client gets 500.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Panic", http = "GET /panic")]
pub struct Panic {}

#[derive(Serialize, Deserialize, Reply)]
pub struct Ok {
    pub ok: bool,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Greeting {
    pub message: String,
}

/// The `basics` manager.
pub struct Basics;

impl Manager for Basics {
    const NAME: &'static str = "basics";
    fn create(_: &Config) -> Result<Self, Error> {
        Result::Ok(Basics)
    }
    fn register(r: &mut Registry<Self>) {
        r.request(Self::noop)
            .request(Self::echo)
            .request(Self::hello)
            .request(Self::panic);
    }
}

impl Basics {
    fn noop(&mut self, _: Noop, _: &mut Context) -> Result<Ok, Error> {
        Result::Ok(Ok { ok: true })
    }

    fn echo(&mut self, ev: Echo, _: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Result::Ok(Json(ev.0))
    }

    fn hello(&mut self, ev: Hello, _: &mut Context) -> Result<Greeting, Error> {
        Result::Ok(Greeting {
            message: format!("Hello, {}!", ev.name),
        })
    }

    fn panic(&mut self, _: Panic, _: &mut Context) -> Result<Ok, Error> {
        panic!("the /panic route panics on purpose")
    }
}

/// `GET /payload/{size}` → exactly `size` bytes.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Payload", http = "GET /payload/{size}")]
pub struct Payload {
    pub size: u64,
}

/// Largest `/payload/{size}`.
pub const MAX_PAYLOAD: u64 = 16 * 1024 * 1024;

/// `GET /sleep/{ms}` → blocks the manager for `ms` milliseconds (at most 60 s).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Sleep", http = "GET /sleep/{ms}")]
pub struct Sleep {
    #[validate(range(max = 60_000))]
    pub ms: u64,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Slept {
    pub slept_ms: u64,
}

/// The `payload` manager. Keeps one buffer of the largest size asked for and
/// answers with slices of it: repeated requests cost no allocation.
pub struct Payloads {
    buffer: bytes::Bytes,
}

impl Manager for Payloads {
    const NAME: &'static str = "payload";
    fn create(_: &Config) -> Result<Self, Error> {
        Result::Ok(Payloads {
            buffer: bytes::Bytes::new(),
        })
    }
    fn register(r: &mut Registry<Self>) {
        r.request(Self::payload).request(Self::sleep);
    }
}

impl Payloads {
    fn payload(&mut self, ev: Payload, _: &mut Context) -> Result<Binary, Error> {
        if ev.size > MAX_PAYLOAD {
            return Err(Error::bad_request(format!(
                "size must be at most {MAX_PAYLOAD} bytes"
            )));
        }
        let size = ev.size as usize;
        if self.buffer.len() < size {
            self.buffer = bytes::Bytes::from(vec![b'x'; size]);
        }
        Result::Ok(Binary(self.buffer.slice(..size)))
    }

    fn sleep(&mut self, ev: Sleep, cx: &mut Context) -> Result<Slept, Error> {
        cx.log(&format!("sleeping {} ms", ev.ms));
        std::thread::sleep(std::time::Duration::from_millis(ev.ms));
        Result::Ok(Slept { slept_ms: ev.ms })
    }
}

switchyard_manager::export_managers!(Basics, Payloads);

/// The manager types of this plugin, as `switchyard.toml` names them.
pub const MANAGERS: &[&str] = &[Basics::NAME, Payloads::NAME];

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_manager::testing::TestManager;

    #[test]
    fn basics_in_process() {
        let mut m = TestManager::<Basics>::new();
        assert_eq!(m.http::<Noop>(&[], "", b"").text(), r#"{"ok":true}"#);
        assert_eq!(
            m.http::<Hello>(&[("name", "Ada")], "", b"").text(),
            r#"{"message":"Hello, Ada!"}"#
        );
        // A query key cannot override a path parameter.
        assert_eq!(
            m.http::<Hello>(&[("name", "Ada")], "name=Eve", b"").text(),
            r#"{"message":"Hello, Ada!"}"#
        );
        let r = m.http::<Hello>(&[("name", "")], "", b"");
        assert_eq!(r.status, 422);
        assert!(r.text().contains(r#""field":"name""#), "{}", r.text());
        assert_eq!(
            m.http::<Echo>(&[], "", br#"{"a":[1,2]}"#).text(),
            r#"{"a":[1,2]}"#
        );
        assert_eq!(m.http::<Echo>(&[], "", b"{nope").status, 400);
        assert_eq!(m.http::<Panic>(&[], "", b"").status, 500);
        assert_eq!(
            m.http::<Noop>(&[], "", b"").status,
            200,
            "still serving after a panic"
        );
    }

    #[test]
    fn payloads_in_process() {
        let mut m = TestManager::<Payloads>::new();
        let r = m.http::<Payload>(&[("size", "1000")], "", b"");
        assert_eq!((r.status, r.body.len()), (200, 1000));
        assert_eq!(m.http::<Payload>(&[("size", "10")], "", b"").body.len(), 10);
        assert_eq!(m.http::<Payload>(&[("size", "99999999999")], "", b"").status, 400);
        let r = m.http::<Payload>(&[("size", "-1")], "", b"");
        assert_eq!(r.status, 422);
        assert!(r.text().contains(r#""field":"size""#), "{}", r.text());
        assert_eq!(m.http::<Sleep>(&[("ms", "60001")], "", b"").status, 422);
    }
}
