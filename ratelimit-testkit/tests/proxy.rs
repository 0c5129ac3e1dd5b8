//! The fault proxy against a real `redis-server`: it forwards, it loses
//! exactly the replies it is told to after the server executed the request,
//! it stalls and resumes, it cuts. Every wait is bounded.

#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use ratelimit_testkit::proxy::{LostReply, Proxy};
use ratelimit_testkit::redis_server::RedisServer;

/// A client's patience for one command: the faults below make it run out.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);

/// A bound on waiting for something that must happen.
const BOUND: Duration = Duration::from_secs(5);

/// A synchronous connection through `url` with short timeouts.
fn connect(url: &str) -> redis::Connection {
    let conn = redis::Client::open(url)
        .expect("valid URL")
        .get_connection_with_timeout(CLIENT_TIMEOUT)
        .expect("connect");
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))
        .expect("timeout");
    conn.set_write_timeout(Some(CLIENT_TIMEOUT))
        .expect("timeout");
    conn
}

/// The counter `key` as the server holds it, read directly (0 if missing).
fn counter(server: &RedisServer, key: &str) -> i64 {
    let v: Option<i64> = redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .expect("GET");
    v.unwrap_or(0)
}

/// Polls `check` until it holds or [`BOUND`] passes; whether it held.
fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + BOUND;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A local server, a proxy in front of it, a key of the server's prefix and
/// a connection through the proxy that has answered a `PING` (so that
/// losses armed next hit the test's own commands, not the handshake).
fn setup(name: &str) -> (RedisServer, Proxy, String, redis::Connection) {
    let server = RedisServer::start_local();
    let proxy = Proxy::start(server.addr());
    let key = format!("{}:{name}", server.prefix());
    let mut conn = connect(&proxy.url());
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    (server, proxy, key, conn)
}

fn ping(conn: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(conn)
}

fn incr(conn: &mut redis::Connection, key: &str) -> redis::RedisResult<i64> {
    redis::cmd("INCR").arg(key).query(conn)
}

#[test]
fn forwards_both_ways() {
    let (server, proxy, key, mut conn) = setup("fwd");
    assert_eq!(proxy.upstream(), server.addr());
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("value")
        .query(&mut conn)
        .unwrap();
    let through: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let direct: String = redis::cmd("GET")
        .arg(&key)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(through, "value");
    assert_eq!(direct, "value");

    let stats = proxy.stats();
    assert_eq!(stats.connections, 1);
    assert_eq!(stats.open, 1);
    assert!(stats.bytes_to_server > 0 && stats.bytes_to_client > 0);
    assert_eq!(stats.replies_lost, 0);
    assert_eq!(stats.upstream_failures, 0);
}

#[test]
fn a_lost_reply_was_executed_once_and_the_client_sees_an_error() {
    let (server, proxy, key, mut conn) = setup("lost");
    proxy.drop_next_reply();
    assert_eq!(proxy.pending_drops(), 1);

    let err = incr(&mut conn, &key).expect_err("the reply is lost: the client sees an error");
    assert!(proxy.wait_replies_lost(1, BOUND), "the server answered");
    assert_eq!(proxy.pending_drops(), 0);
    assert_eq!(
        counter(&server, &key),
        1,
        "executed exactly once on the server ({err})"
    );
    // The connection was closed; the proxy serves new ones, and only one reply was lost.
    assert!(eventually(|| proxy.stats().open == 0));
    let mut again = connect(&proxy.url());
    assert_eq!(incr(&mut again, &key).unwrap(), 2);
    assert_eq!(proxy.stats().replies_lost, 1);
    assert_eq!(proxy.stats().connections, 2);
}

#[test]
fn losses_can_target_one_command_and_count_down() {
    let server = RedisServer::start_local();
    let proxy = Proxy::start(server.addr());
    let key = format!("{}:targeted", server.prefix());

    let mut conn = connect(&proxy.url());
    proxy.drop_replies_to(b"INCR", 2);
    // Other commands pass.
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    assert_eq!(proxy.pending_drops(), 2);
    // Two INCRs, each on a fresh connection, are both executed and both lost.
    incr(&mut conn, &key).expect_err("first reply lost");
    let mut second = connect(&proxy.url());
    incr(&mut second, &key).expect_err("second reply lost");
    assert!(proxy.wait_replies_lost(2, BOUND));
    assert_eq!(counter(&server, &key), 2);
    // The third passes.
    let mut third = connect(&proxy.url());
    assert_eq!(incr(&mut third, &key).unwrap(), 3);

    // Armed losses can be withdrawn.
    proxy.drop_next_replies(4);
    assert_eq!(proxy.cancel_drops(), 4);
    assert_eq!(incr(&mut third, &key).unwrap(), 4);
    assert_eq!(proxy.stats().replies_lost, 2);
}

#[test]
fn a_held_reply_times_the_client_out_after_the_server_executed() {
    let (server, proxy, key, mut conn) = setup("held");
    proxy.set_lost_reply(LostReply::Hold);
    proxy.drop_next_reply();

    let started = Instant::now();
    let err = incr(&mut conn, &key).expect_err("the reply is held");
    assert!(err.is_timeout(), "the client timed out: {err}");
    assert!(started.elapsed() >= CLIENT_TIMEOUT);
    assert!(proxy.wait_replies_lost(1, BOUND));
    assert_eq!(counter(&server, &key), 1);
    // The held connection stays open and silent; cut_all closes it.
    assert_eq!(proxy.stats().open, 1);
    proxy.cut_all();
    assert_eq!(proxy.stats().open, 0);
}

#[test]
fn pause_stalls_both_ways_and_resume_delivers() {
    let (server, proxy, key, mut conn) = setup("paused");
    proxy.pause();
    assert!(proxy.is_paused());
    let err = incr(&mut conn, &key).expect_err("nothing is forwarded while paused");
    assert!(err.is_timeout(), "the client timed out: {err}");
    // The request did not reach the server...
    assert_eq!(counter(&server, &key), 0);
    proxy.resume();
    assert!(!proxy.is_paused());
    // ...and is delivered on resume, late (as a stalled network would).
    assert!(
        eventually(|| counter(&server, &key) == 1),
        "the stalled request arrives after resume"
    );
    let mut fresh = connect(&proxy.url());
    assert_eq!(incr(&mut fresh, &key).unwrap(), 2);
}

#[test]
fn cut_all_closes_every_connection() {
    let server = RedisServer::start_local();
    let proxy = Proxy::start(server.addr());

    let mut a = connect(&proxy.url());
    let mut b = connect(&proxy.url());
    assert_eq!(ping(&mut a).unwrap(), "PONG");
    assert_eq!(ping(&mut b).unwrap(), "PONG");
    assert_eq!(proxy.stats().open, 2);

    proxy.cut_all();
    assert_eq!(proxy.stats().open, 0);
    assert!(ping(&mut a).is_err());
    assert!(ping(&mut b).is_err());
    let mut c = connect(&proxy.url());
    assert_eq!(ping(&mut c).unwrap(), "PONG");
    assert_eq!(proxy.stats().connections, 3);
}

#[test]
fn a_dead_upstream_closes_the_client() {
    let mut server = RedisServer::start_local();
    let proxy = Proxy::start(server.addr());
    server.kill();
    let result = redis::Client::open(proxy.url())
        .unwrap()
        .get_connection_with_timeout(CLIENT_TIMEOUT)
        .and_then(|mut c| ping(&mut c));
    assert!(result.is_err());
    assert!(eventually(|| proxy.stats().upstream_failures >= 1));
    server.restart();
    let mut conn = connect(&proxy.url());
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}
