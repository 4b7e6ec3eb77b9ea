//! Managers loaded as plugin libraries: typed routes, validation, calls
//! between managers through the router, notification fan-out, and the ABI
//! check that refuses a plugin before anything starts.

mod common;

use common::*;

fn shop_config(plugin: &std::path::Path) -> String {
    let p = plugin.display();
    format!(
        r#"
[[managers]]
name = "orders"
plugin = "{p}"

[[managers]]
name = "inventory"
plugin = "{p}"
[managers.config]
stock = {{ apple = 10, pear = 3 }}
"#
    )
}

#[test]
fn a_plugin_serves_typed_routes_calls_and_notifications_across_processes() {
    let plugin = plugin("switchyard-example-shop");
    let g = Group::builder("shop").config(&shop_config(&plugin)).start();
    assert_ne!(g.pid_of("orders"), g.pid_of("inventory"));

    let r = get(g.addr, "/inventory/apple").unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, r#"{"sku":"apple","available":10}"#)
    );

    // orders → (router) → inventory, then order.created → (router) → inventory.
    let r = request(
        g.addr,
        "POST",
        "/orders",
        br#"{"sku":"apple","qty":4,"customer_id":42}"#,
    )
    .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let created: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(created["stock_left"], 6);
    assert_eq!(created["order"]["id"], 1);
    let r = get(g.addr, "/orders/1").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        get(g.addr, "/inventory/apple").unwrap().text(),
        r#"{"sku":"apple","available":6}"#
    );
    // The notification reached the other process (delivery is asynchronous:
    // poll the manager's own view of it).
    let stats = eventually("order.created reaches inventory", PATIENCE, || {
        let stats: serde_json::Value =
            serde_json::from_slice(&get(g.addr, "/inventory-stats").unwrap().body).unwrap();
        if stats["orders_seen"] == 1 {
            Ok(stats)
        } else {
            Err(stats)
        }
    });
    assert_eq!(stats["units_ordered"], 4);

    // The callee's refusal comes back through the caller.
    let r = request(
        g.addr,
        "POST",
        "/orders",
        br#"{"sku":"pear","qty":5,"customer_id":1}"#,
    )
    .unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("only 3 of `pear` left"), "{}", r.text());
    // Validation: 422 naming the field, as problem+json.
    let r = request(
        g.addr,
        "POST",
        "/orders",
        br#"{"sku":"pear","qty":0,"customer_id":1}"#,
    )
    .unwrap();
    assert_eq!(r.status, 422);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(problem["errors"][0]["field"], "qty", "{problem}");
    let r = request(
        g.addr,
        "POST",
        "/orders",
        br#"{"sku":"pear","qty":"many","customer_id":1}"#,
    )
    .unwrap();
    assert_eq!(r.status, 422);
    assert!(r.text().contains(r#""field":"qty""#), "{}", r.text());
}

#[test]
fn the_demo_loads_from_its_cdylib_like_any_plugin() {
    let plugin = plugin("switchyard-demo-plugin");
    let config = format!(
        "[[managers]]\nname = \"basics\"\nplugin = \"{p}\"\n[[managers]]\nname = \"payload\"\nplugin = \"{p}\"\n",
        p = plugin.display()
    );
    let g = Group::builder("demo-so").config(&config).start();
    assert_eq!(
        get(g.addr, "/hello/Ada").unwrap().text(),
        r#"{"message":"Hello, Ada!"}"#
    );
    // A panic is a 500; the same process serves the next request.
    let pid = g.pid_of("basics");
    assert_eq!(get(g.addr, "/panic").unwrap().status, 500);
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
    assert_eq!(g.pid_of("basics"), pid);
}

#[test]
fn a_plugin_with_another_abi_version_is_refused_before_anything_starts() {
    let plugin = plugin("switchyard-fixture-wrong-abi");
    let config = format!(
        "[[managers]]\nname = \"basics\"\n[[managers]]\nname = \"future\"\nplugin = \"{}\"\n",
        plugin.display()
    );
    let out = match Group::builder("wrong-abi").config(&config).try_start() {
        Ok(_) => panic!("a group with a wrong-ABI plugin started"),
        Err(out) => out,
    };
    assert!(
        out.contains("exit status: 64"),
        "exit code 64 (configuration error): {out}"
    );
    assert!(out.contains("managers[1].plugin"), "names the key: {out}");
    let ours = format!("ABI v{}", switchyard_manager_abi::ABI_VERSION);
    assert!(
        out.contains("ABI v999") && out.contains(&ours),
        "names both versions: {out}"
    );
    assert!(!out.contains("started role"), "no process was started: {out}");
}

#[test]
fn unknown_manager_in_a_plugin_is_a_configuration_error() {
    let plugin = plugin("switchyard-example-shop");
    let config = format!(
        "[[managers]]\nname = \"billing\"\nplugin = \"{}\"\n",
        plugin.display()
    );
    let out = Group::builder("no-such")
        .config(&config)
        .try_start()
        .err()
        .expect("refused");
    assert!(
        out.contains("managers[0].name: the plugin has no manager `billing` (it has: orders, inventory)"),
        "{out}"
    );
}

#[test]
fn a_panic_with_its_backtrace_is_one_error_record() {
    let plugin = plugin("switchyard-demo-plugin");
    // The built-in demo (the host's std) and the same code as a plugin
    // (the plugin's own std, whose hook the SDK sets).
    for (tag, entry) in [
        ("panic-log-builtin", String::new()),
        ("panic-log-plugin", format!("plugin = \"{}\"\n", plugin.display())),
    ] {
        let config = format!("[log]\nformat = \"json\"\n\n[[managers]]\nname = \"basics\"\n{entry}");
        let g = Group::builder(tag)
            .config(&config)
            .env("RUST_BACKTRACE", "1")
            .start();
        let pid = g.pid_of("basics");
        assert_eq!(get(g.addr, "/panic").unwrap().status, 500);
        let prefix = format!("basics[{pid}]");
        let record = eventually("the panic's record", PATIENCE, || {
            g.lines_with("panicked")
                .into_iter()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
                .find(|r| r["process"] == prefix.as_str() && r.to_string().contains("backtrace"))
                .ok_or("not yet")
        });
        assert_eq!(record["level"], "ERROR", "{record}");
        // Every line of the process is a record with a level: no loose
        // backtrace lines.
        let loose: Vec<String> = g
            .lines_with(&prefix)
            .into_iter()
            .filter(|l| serde_json::from_str::<serde_json::Value>(l).map_or(true, |r| r["level"].is_null()))
            .collect();
        assert!(loose.is_empty(), "{tag}: lines without a level: {loose:#?}");
        assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
    }
}
