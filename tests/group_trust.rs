//! Trust inside the group (docs/security-trust.md, decision 0100): a
//! plugin that speaks the group's wire from inside its manager process
//! gets nothing a manager of its name may not have. Each attack is refused
//! (the fixture reports what the group answered; the log says why), and
//! the group goes on serving.

mod common;

use common::*;

fn attack(g: &Group, what: &str) -> serde_json::Value {
    let r = request(g.addr, "POST", &format!("/attack/{what}"), b"{}").unwrap();
    assert_eq!(r.status, 200, "attack {what}: {}", r.text());
    r.json()
}

/// The demo's routes still answer as the demo's.
fn serving(g: &Group) {
    let r = get(g.addr, "/noop").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(g.addr, "/hello/trust").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("trust"), "{}", r.text());
}

#[test]
fn a_plugin_cannot_take_another_role_name_type_route_request_or_identity() {
    let plugin = plugin("switchyard-fixture-rogue");
    let scratch = scratch_dir("trust-rt");
    let runtime_dir = scratch.path().join("rt");
    let config = format!(
        "[[managers]]\nname = \"basics\"\n[[managers]]\nname = \"payload\"\n\
         [[managers]]\nname = \"rogue\"\nplugin = \"{}\"\n[managers.config]\nruntime_dir = \"{}\"\n",
        plugin.display(),
        runtime_dir.display()
    );
    let mut g = Group::builder("group-trust")
        .config(&config)
        .runtime_dir(&runtime_dir)
        .start();
    g.eventually_status("/noop", 200);

    // The broker's router: whoever says HelloRouter got every request.
    assert_eq!(attack(&g, "router")["outcome"], "refused");
    g.wait_line("refusing hello: the supervisor did not give this process that role");
    serving(&g);

    // A listener's pipe: requests from it would be client requests.
    assert_eq!(attack(&g, "pipe")["outcome"], "refused");
    serving(&g);

    // Another manager's name, type, and route.
    assert_eq!(attack(&g, "impersonate")["outcome"], "refused");
    g.wait_line("refusing manager hello: the supervisor did not start this process as that manager");
    assert_eq!(attack(&g, "type")["outcome"], "refused");
    g.wait_line("event type `demo.Noop` is declared by manager `basics`");
    assert_eq!(attack(&g, "route")["outcome"], "refused");
    g.wait_line("route `GET /noop` is declared by manager `basics`");
    // A route of the same shape would take `/hello/{name}`'s requests.
    assert_eq!(attack(&g, "shadow")["outcome"], "refused");
    g.wait_line("route `GET /hello/{any}` is declared by manager `basics`");
    serving(&g);

    // A call carrying the context only the listener sets: `demo.Whoami`,
    // which reads the client's address and `User-Agent` from the context
    // whoever calls, sees none of it.
    let seen = attack(&g, "identity");
    assert_eq!(seen["status"], 200, "{seen}");
    let body: serde_json::Value = serde_json::from_str(seen["body"].as_str().unwrap()).unwrap();
    for field in ["sub", "client", "user_agent"] {
        assert_eq!(
            body[field],
            serde_json::Value::Null,
            "forged context got through: {seen}"
        );
    }
    g.wait_line("stripped listener-only request context");

    // Answers for requests another instance holds. The fixture's second
    // instance takes a request of its own first, which tells it the
    // listener's numbering; then a request to `payload` is in flight, and
    // it sends answers for the requests that followed the bait.
    forged_answers_are_refused(
        &mut g,
        "forge",
        "response refused: this instance was not sent the request",
    );

    serving(&g);
}

/// The direct return path (decision 0143) opens no door: an instance may
/// offer any listener pipe a return link, but an answer on it is taken
/// only with its request's token, which only the instance the router
/// picked was sent. The fixture's second instance learns its own
/// request's pipe, correlation and token, then writes answers for the
/// requests after it (its own token and guesses) into a link it offers
/// that pipe while a request to `payload` waits there.
#[test]
fn a_plugin_cannot_answer_straight_back_for_another_instance() {
    let plugin = plugin("switchyard-fixture-rogue");
    let scratch = scratch_dir("trust-direct-rt");
    let runtime_dir = scratch.path().join("rt");
    // One pipe, so the waiting request is on the pipe the forgeries go to.
    let config = format!(
        "[group]\nreturn_path = \"direct\"\n[listener]\npipes = 1\n\
         [[managers]]\nname = \"basics\"\n[[managers]]\nname = \"payload\"\n\
         [[managers]]\nname = \"rogue\"\nplugin = \"{}\"\n[managers.config]\nruntime_dir = \"{}\"\n",
        plugin.display(),
        runtime_dir.display()
    );
    let mut g = Group::builder("group-trust-direct")
        .config(&config)
        .runtime_dir(&runtime_dir)
        .start();
    g.eventually_status("/noop", 200);
    serving(&g);

    forged_answers_are_refused(
        &mut g,
        "forge-direct",
        "direct answer refused: it does not carry its request's token",
    );

    serving(&g);
}

/// The rogue instance learns the listener's numbering from a request of
/// its own (the bait), then, while a request to `payload` is in flight,
/// sends answers (`attack`) for the requests that followed: the real
/// answer must reach the client, and the group must log `refused`.
fn forged_answers_are_refused(g: &mut Group, attack_name: &str, refused: &str) {
    assert_eq!(attack(g, "bait")["outcome"], "welcomed");
    g.eventually_status("/bait", 200);
    let addr = g.addr;
    let slow = std::thread::spawn(move || get(addr, "/sleep/3000").unwrap());
    eventually("the request to payload is in flight", PATIENCE, || {
        let router = g.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["role"] == "router")
            .cloned()
            .unwrap_or_default();
        (router["load"]["in_flight"].as_u64() >= Some(1))
            .then_some(())
            .ok_or(router)
    });
    let forged = attack(g, attack_name);
    assert!(forged["sent"].as_u64() > Some(0), "{forged}");
    let r = slow.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !r.text().contains("forged"),
        "a forged answer was taken: {}",
        r.text()
    );
    assert!(r.text().contains("slept_ms"), "{}", r.text());
    g.wait_line(refused);
}
