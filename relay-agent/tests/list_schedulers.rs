//! `polycorn-relay --list-schedulers` prints the built-in compositions, one
//! name a line, and exits 0 with no other option, configuration or
//! certificate (scripts and the chart's schema read it; runs the real
//! binary).

use std::process::Command;

#[test]
fn list_schedulers_prints_the_builtin_compositions_alone() {
    let out = Command::new(env!("CARGO_BIN_EXE_polycorn-relay"))
        .arg("--list-schedulers")
        .env_clear()
        .env("POLYCORN_RELAY_CONFIG", "/nonexistent/polycorn.toml")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let names: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(names, polycorn_core::sched::builtin_pipeline_names().collect::<Vec<_>>());
    assert!(!names.contains(&"even-minrtt"), "only the built-in ones");
}
