//! Which event types a client may name (decision 0108): a WebSocket or
//! gRPC request, or a client's notification, reaches a manager only for a
//! type some manager declares under that very name and marks public
//! (`#[event(public)]`, or an HTTP route), or that the operator opens
//! with `[auth] expose`. Every other name gets what a type no manager
//! declares gets from the router, so an internal type cannot be told
//! from an undeclared one, and a name whose 64-bit id collides with a
//! declared type's is refused before it is routed by that id.

use switchyard_proto::EventType;
use switchyard_proto::control::DeclaredType;

use crate::routes::Routes;
use crate::state::State;
use switchyard_middleware::config::exposed;
use switchyard_middleware::identity::Identity;

/// What the client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sending {
    /// A request (`/ws` message, `Events/Call`, a typed rpc).
    Request,
    /// A notification (`{"notify": ..}`, `Events/Notify`).
    Notification,
}

/// Why a client may not send a type: the status and detail the router
/// gives a type no manager declares.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) status: u16,
    pub(crate) detail: String,
}

/// Admits a client's `name` ([`Sending`]) against the declared types of
/// `routes`, or says how the router would refuse an undeclared type.
///
/// A request needs a declared request type of that name, public or
/// exposed, or, for a type no local manager declares (another group's),
/// a route of that name in the table. A notification of a type some manager declares (as a
/// request, a subscription or an emission) needs that name and the type
/// public or exposed; one whose id no manager declares reaches no
/// manager (client subscribers only) and passes, except while a manager
/// has not started yet, when nobody can tell what it would reach.
pub(crate) fn admit(routes: &Routes, expose: &[String], name: &str, sending: Sending) -> Result<(), Refused> {
    let id = EventType::of(name);
    let open = |t: &DeclaredType| t.name == name && (t.public || exposed(expose, name));
    let admitted = match sending {
        // Another group's type is not declared here, but one with a route
        // in the table is public (a route makes a type public): it is
        // reached by name as by its path (decision 0115).
        Sending::Request => match routes.request_type(id) {
            Some(declared) => open(declared),
            None => !routes.paths_of(name).is_empty(),
        },
        Sending::Notification => {
            let declared: Vec<&DeclaredType> = [routes.request_type(id), routes.notification_type(id)]
                .into_iter()
                .flatten()
                .collect();
            if declared.is_empty() {
                not_started(routes, name).is_none()
            } else {
                declared.into_iter().all(open)
            }
        }
    };
    if admitted {
        return Ok(());
    }
    Err(not_started(routes, name).unwrap_or_else(|| Refused {
        status: 404,
        detail: format!("no manager declares event type `{name}`"),
    }))
}

/// The router's answer for an undeclared type while a configured manager
/// has no instance up: it may be the one that declares it.
fn not_started(routes: &Routes, name: &str) -> Option<Refused> {
    if routes.table.version == 0 {
        // No route table yet: the router has not said what anyone declares.
        return Some(Refused {
            status: 503,
            detail: format!("no running manager declares event type `{name}`; the group is starting"),
        });
    }
    let missing = routes.table.managers.iter().find(|m| m.instances_up == 0)?;
    Some(Refused {
        status: 503,
        detail: format!(
            "no running manager declares event type `{name}`; manager `{}` has not started yet",
            missing.name
        ),
    })
}

/// A client's `scheduler.Schedule` or `scheduler.Update` (once exposed):
/// the job's target is admitted as if the client sent it itself now —
/// public or exposed, the rules for its type with the client's identity,
/// and `listener.ws.notify` for a notification — so that a job never
/// does what its client may not (decision 0110). Other types pass.
pub(crate) fn check_job(
    state: &State,
    ty: &str,
    body: &[u8],
    identity: Option<&Identity>,
) -> Result<(), Refused> {
    if ty != "scheduler.Schedule" && ty != "scheduler.Update" {
        return Ok(());
    }
    let refused = |status: u16, detail: String| Refused { status, detail };
    let Ok(job) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Err(refused(422, format!("a client's {ty} is a JSON object")));
    };
    let Some(event) = job.get("event").and_then(serde_json::Value::as_str) else {
        // An update that leaves the target as it is (the scheduler
        // refuses a client's `kind` without `event`).
        return Ok(());
    };
    let notification = job.get("kind").and_then(serde_json::Value::as_str) == Some("notification");
    if notification && !state.config.ws.notify {
        return Err(refused(
            403,
            "client notifications are disabled (listener.ws.notify)".to_owned(),
        ));
    }
    let sending = if notification {
        Sending::Notification
    } else {
        Sending::Request
    };
    let routes = state.pool.routes();
    admit(&routes, &state.config.middleware.auth.expose, event, sending)?;
    state
        .policy()
        .authorize_event(identity, event, routes.event_paths())
        .map_err(|r| refused(r.status(), r.detail()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::control::{ManagerHealth, RouteTable};

    fn declared(name: &str, public: bool) -> DeclaredType {
        DeclaredType {
            name: name.into(),
            event_type: EventType::of(name),
            public,
        }
    }

    fn routes(up: u32) -> Routes {
        Routes::default().merged(RouteTable {
            version: 1,
            types: vec![
                declared("shop.GetOrder", true),
                declared("inventory.Reserve", false),
            ],
            notifications: vec![declared("chat.Said", true), declared("order.created", false)],
            managers: vec![ManagerHealth {
                name: "shop".into(),
                instances_up: up,
            }],
            ..Default::default()
        })
    }

    #[test]
    fn only_public_or_exposed_declared_names_pass() {
        let r = routes(1);
        let none: &[String] = &[];
        assert_eq!(admit(&r, none, "shop.GetOrder", Sending::Request), Ok(()));
        let undeclared = |name: &str| Refused {
            status: 404,
            detail: format!("no manager declares event type `{name}`"),
        };
        for name in ["inventory.Reserve", "shop.Nope"] {
            assert_eq!(admit(&r, none, name, Sending::Request), Err(undeclared(name)));
        }
        let expose = ["inventory.*".to_owned()];
        assert_eq!(admit(&r, &expose, "inventory.Reserve", Sending::Request), Ok(()));
        // Notifications: public ones and names no manager declares pass.
        assert_eq!(admit(&r, none, "chat.Said", Sending::Notification), Ok(()));
        assert_eq!(admit(&r, none, "client.ping", Sending::Notification), Ok(()));
        for name in ["order.created", "inventory.Reserve"] {
            assert_eq!(
                admit(&r, none, name, Sending::Notification),
                Err(undeclared(name))
            );
        }
        // While a manager has not started, an unknown name is 503.
        let starting = routes(0);
        assert_eq!(
            admit(&starting, none, "shop.Nope", Sending::Request).map_err(|r| r.status),
            Err(503)
        );
    }

    #[test]
    fn another_groups_routed_types_are_reached_by_name_and_only_those() {
        let remote = |name: &str, path: &str| switchyard_proto::control::RouteEntry {
            route: switchyard_proto::control::HttpRoute {
                method: "GET".into(),
                path: path.into(),
                stream_body: false,
            },
            event_type: EventType::of(name),
            type_name: name.into(),
            manager: "payload@b".into(),
        };
        let r = Routes::default().merged(RouteTable {
            version: 1,
            routes: vec![remote("demo.Payload", "/payload/{size}")],
            ..Default::default()
        });
        assert_eq!(admit(&r, &[], "demo.Payload", Sending::Request), Ok(()));
        // A remote type without a route (internal there, or only
        // `#[event(public)]`): as undeclared.
        assert_eq!(
            admit(&r, &[], "demo.Other", Sending::Request).map_err(|r| r.status),
            Err(404)
        );
    }

    #[test]
    fn a_name_colliding_with_a_declared_id_is_refused() {
        // Another name under a declared type's id: routed by the id, it
        // would reach `shop.GetOrder`'s handler.
        let mut r = RouteTable {
            version: 1,
            ..Default::default()
        };
        let mut forged = declared("shop.GetOrder", true);
        forged.event_type = EventType::of("forged.Name");
        r.types.push(forged);
        let r = Routes::default().merged(r);
        let refused = admit(&r, &[], "forged.Name", Sending::Request).unwrap_err();
        assert_eq!(refused.status, 404);
        let refused = admit(&r, &[], "forged.Name", Sending::Notification).unwrap_err();
        assert_eq!(refused.status, 404);
    }
}
