//! The `redis-server` fixture under other tests' servers: a port taken by
//! another server is not mistaken for this one's, and a killed server's port
//! stays refused until its restart. Every wait is bounded.

#![cfg(feature = "redis")]

use std::net::TcpStream;
use std::time::Duration;

use ratelimit_testkit::server_process::{ServerOptions, ServerProcess};

/// The `process_id` the server at `url` reports.
fn pid_at(url: &str) -> u32 {
    let mut conn = redis::Client::open(url)
        .expect("valid URL")
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut conn)
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("process_id")
        .trim()
        .parse()
        .expect("a number")
}

#[test]
fn a_port_answered_by_another_server_is_not_taken_for_started() {
    let options = ServerOptions::new();
    let other = ServerProcess::start(&options);
    // The new server cannot bind the port; the old one answers PING there.
    let attempt = ServerProcess::try_start_on(other.port(), &options);
    let error = attempt.expect_err("a start on a port another server holds must fail");
    assert!(
        error.contains("another redis-server") || error.contains("exited at start"),
        "{error}"
    );
    // The other server is untouched.
    assert_ne!(pid_at(&other.url()), 0);
}

#[test]
fn a_killed_servers_port_is_refused_and_cannot_be_taken_until_restart() {
    let options = ServerOptions::new();
    let mut server = ServerProcess::start(&options);
    let port = server.port();
    server.kill();
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "nothing may answer on a killed server's port"
    );
    let taker = ServerProcess::try_start_on(port, &options);
    assert!(
        taker.is_err(),
        "another server took the killed server's port before its restart"
    );
    server.restart();
    assert_eq!(server.port(), port);
    let first = pid_at(&server.url());
    server.restart();
    assert_ne!(
        pid_at(&server.url()),
        first,
        "a restart starts a new process"
    );
}
