//! A plugin links the SDK and the ABI, never the host's side: no library
//! loading, no worker pool, and of tokio only the scheduler of the
//! plugin's own runtime (decision 0120), none of its networking unless the
//! plugin asks for it.

use std::process::Command;

fn tree(package: &str, extra: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--locked", "--prefix", "none", "-p", package])
        .args(if extra.is_empty() {
            &["-e", "normal"][..]
        } else {
            extra
        })
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn plugins_link_neither_the_host_nor_tokio_networking() {
    for plugin in ["switchyard-example-shop", "switchyard-demo-plugin"] {
        let tree = tree(plugin, &[]);
        assert!(
            tree.contains("switchyard-manager-abi "),
            "{plugin} links the ABI crate:\n{tree}"
        );
        for crate_name in [
            "libloading ",
            "mio ",
            "switchyard-manager-host ",
            "switchyard-worker ",
        ] {
            assert!(
                !tree.lines().any(|line| line.starts_with(crate_name)),
                "{plugin} depends on {crate_name}:\n{tree}"
            );
        }
    }
}

#[test]
fn a_plugin_that_asks_nothing_of_tokio_gets_its_scheduler_only() {
    let features = tree("switchyard-example-shop", &["-e", "features", "-i", "tokio"]);
    let enabled: Vec<&str> = features
        .lines()
        .filter_map(|line| line.strip_prefix("tokio feature "))
        .collect();
    assert_eq!(enabled, ["\"rt\""], "{features}");
}
