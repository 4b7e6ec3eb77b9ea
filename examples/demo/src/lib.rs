//! The demo application: what `switchyard up` serves with no configuration.
//!
//! Two managers, so that the group shows routing between processes:
//! `basics` answers `/noop`, `/echo`, `/hello/{name}` and `/panic`;
//! `payload` answers `/payload/{size}` and `/sleep/{ms}` (which blocks the
//! manager: a stand-in for slow work until worker pools exist).

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use switchyard_manager::{Binary, Context, Error, Event, Json, Manager, Registry, Request};

/// `GET /noop` → `{"ok":true}`.
#[derive(Deserialize, Serialize)]
pub struct Noop {}
impl Event for Noop {
    const NAME: &'static str = "demo.Noop";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("GET", "/noop"));
}

/// `POST /echo` → the JSON body, echoed.
#[derive(Deserialize, Serialize)]
pub struct Echo(pub serde_json::Value);
impl Event for Echo {
    const NAME: &'static str = "demo.Echo";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("POST", "/echo"));
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        request.json().map(Echo)
    }
}

/// `GET /hello/{name}` → `{"message":"Hello, NAME!"}`.
#[derive(Deserialize, Serialize)]
pub struct Hello {
    pub name: String,
}
impl Event for Hello {
    const NAME: &'static str = "demo.Hello";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("GET", "/hello/{name}"));
}

/// `GET /panic` → the handler panics; the client gets 500.
#[derive(Deserialize, Serialize)]
pub struct Panic {}
impl Event for Panic {
    const NAME: &'static str = "demo.Panic";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("GET", "/panic"));
}

#[derive(Serialize)]
pub struct Ok {
    pub ok: bool,
}

#[derive(Serialize)]
pub struct Greeting {
    pub message: String,
}

/// The `basics` manager.
#[derive(Default)]
pub struct Basics;

impl Manager for Basics {
    const NAME: &'static str = "basics";
    fn register(r: &mut Registry<Self>) {
        r.request(Self::noop)
            .request(Self::echo)
            .request(Self::hello)
            .request(Self::panic);
    }
}

impl Basics {
    fn noop(&mut self, _: Noop, _: &mut Context) -> Result<Json<Ok>, Error> {
        Result::Ok(Json(Ok { ok: true }))
    }

    fn echo(&mut self, ev: Echo, _: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Result::Ok(Json(ev.0))
    }

    fn hello(&mut self, ev: Hello, _: &mut Context) -> Result<Json<Greeting>, Error> {
        Result::Ok(Json(Greeting {
            message: format!("Hello, {}!", ev.name),
        }))
    }

    fn panic(&mut self, _: Panic, _: &mut Context) -> Result<Json<Ok>, Error> {
        panic!("the /panic route panics on purpose")
    }
}

/// `GET /payload/{size}` → exactly `size` bytes.
#[derive(Deserialize, Serialize)]
pub struct Payload {
    pub size: u64,
}
impl Event for Payload {
    const NAME: &'static str = "demo.Payload";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("GET", "/payload/{size}"));
}

/// Largest `/payload/{size}`.
pub const MAX_PAYLOAD: u64 = 16 * 1024 * 1024;

/// The `payload` manager. Keeps the last body it built: repeated sizes (the
/// benchmark's case) cost no allocation.
#[derive(Default)]
pub struct Payloads {
    last: bytes::Bytes,
}

impl Manager for Payloads {
    const NAME: &'static str = "payload";
    fn register(r: &mut Registry<Self>) {
        r.request(Self::payload).request(Self::sleep);
    }
}

/// `GET /sleep/{ms}` → blocks the manager for `ms` milliseconds (at most 60 s).
#[derive(Deserialize, Serialize)]
pub struct Sleep {
    pub ms: u64,
}
impl Event for Sleep {
    const NAME: &'static str = "demo.Sleep";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("GET", "/sleep/{ms}"));
}

#[derive(Serialize)]
pub struct Slept {
    pub slept_ms: u64,
}

impl Payloads {
    fn payload(&mut self, ev: Payload, _: &mut Context) -> Result<Binary, Error> {
        if ev.size > MAX_PAYLOAD {
            return Err(Error::bad_request(format!(
                "size must be at most {MAX_PAYLOAD} bytes"
            )));
        }
        if self.last.len() as u64 != ev.size {
            self.last = bytes::Bytes::from(vec![b'x'; ev.size as usize]);
        }
        Result::Ok(Binary(self.last.clone()))
    }

    fn sleep(&mut self, ev: Sleep, cx: &mut Context) -> Result<Json<Slept>, Error> {
        if ev.ms > 60_000 {
            return Err(Error::bad_request("ms must be at most 60000"));
        }
        cx.log(&format!("sleeping {} ms", ev.ms));
        std::thread::sleep(std::time::Duration::from_millis(ev.ms));
        Result::Ok(Json(Slept { slept_ms: ev.ms }))
    }
}

/// The demo managers by name, as the supervisor starts them.
pub const MANAGERS: &[&str] = &[Basics::NAME, Payloads::NAME];

/// Creates the demo manager called `name`.
pub fn service(name: &str) -> Option<Box<dyn switchyard_manager::Service>> {
    match name {
        Basics::NAME => Some(Box::new(switchyard_manager::Dispatcher::new(Basics))),
        Payloads::NAME => Some(Box::new(switchyard_manager::Dispatcher::new(Payloads::default()))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_manager::Service;
    use switchyard_proto::{EventType, Meta};

    fn call(svc: &mut dyn Service, ty: &str, meta: &[(&str, &str)], body: &[u8]) -> (u16, String) {
        let meta = Meta(meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let r = svc.handle(EventType::of(ty), 1, &meta, body);
        (r.status, String::from_utf8_lossy(&r.body).into_owned())
    }

    #[test]
    fn handlers_in_process() {
        let mut basics = service("basics").unwrap();
        assert_eq!(
            call(&mut *basics, "demo.Noop", &[], b""),
            (200, r#"{"ok":true}"#.into())
        );
        assert_eq!(
            call(&mut *basics, "demo.Hello", &[("p.name", "Ada")], b"").1,
            r#"{"message":"Hello, Ada!"}"#
        );
        assert_eq!(
            call(&mut *basics, "demo.Echo", &[], br#"{"a":[1,2]}"#),
            (200, r#"{"a":[1,2]}"#.into())
        );
        assert_eq!(call(&mut *basics, "demo.Echo", &[], b"{nope").0, 400);
        assert_eq!(call(&mut *basics, "demo.Panic", &[], b"").0, 500);
        // Still serving after the panic.
        assert_eq!(call(&mut *basics, "demo.Noop", &[], b"").0, 200);

        let mut payload = service("payload").unwrap();
        let (status, body) = call(&mut *payload, "demo.Payload", &[("p.size", "1000")], b"");
        assert_eq!((status, body.len()), (200, 1000));
        assert_eq!(
            call(&mut *payload, "demo.Payload", &[("p.size", "99999999999")], b"").0,
            400
        );
        assert_eq!(
            call(&mut *payload, "demo.Payload", &[("p.size", "-1")], b"").0,
            422
        );
    }
}
