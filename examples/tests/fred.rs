//! The `fred` example: a limiter over a fred client the application holds
//! (`RedisStore::from_fred`), run against a real Redis started by the
//! testkit.

use std::process::Command;

use ratelimit_testkit::redis_server::RedisServer;

#[test]
fn the_fred_example_limits_through_the_applications_client() {
    let server = RedisServer::start();
    let out = Command::new(env!("CARGO_BIN_EXE_fred"))
        .args(["--redis", &server.url()])
        .output()
        .expect("run the fred example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the fred example failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 5 per second, burst 5: eight calls at once, five admitted by Redis.
    let admitted = stdout.matches("admitted (Store)").count();
    let denied = stdout.matches("denied (Store)").count();
    assert_eq!((admitted, denied), (5, 3), "{stdout}");
    assert!(
        stdout.contains("call 6: denied (Store), 0 left, retry after"),
        "{stdout}"
    );
    for field in [
        "Retry-After: 1",
        "RateLimit-Policy: \"calls\";q=5;w=1",
        "RateLimit: \"calls\";r=0;t=1",
    ] {
        assert!(stdout.contains(field), "no {field:?} in\n{stdout}");
    }
    // The application's own command, through the same client, sees the
    // caller's state under the store's key.
    assert!(
        stdout.contains("fred-example:{fred~customer-42}:calls:")
            && stdout.contains("in Redis: true"),
        "{stdout}"
    );
}
