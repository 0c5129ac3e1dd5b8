//! Contract 7 in Redis itself: adversarial callers map to distinct keys
//! whose hash tag is the whole escaped caller (or, for long callers, its
//! hash), never share state, and every key stays within
//! `keys::MAX_KEY_LEN`.

mod common;

use ratelimit_core::StoreExt;
use std::collections::HashSet;

use ratelimit_core::{Quota, Rate};
use ratelimit_redis::keys;
use ratelimit_testkit::redis_server::RedisServer;

fn adversarial() -> Vec<Vec<u8>> {
    let mut callers: Vec<Vec<u8>> = [
        &b""[..],
        b"a",
        b"{a}",
        b"{",
        b"}",
        b"}{",
        b"{}",
        b"a}:{b",
        b"a:b",
        b"a%3Ab",
        b"a%3ab",
        b"%",
        b"%%",
        b"%25",
        b"a b",
        b"a\nb",
        b"a\r\nb",
        b"\0",
        b"\xff\xfe",
        b"caf\xc3\xa9",
        b"caf\xe9",
        b"x:default:tb",
        b"x}:default:tb",
        b"rl:{x}:default:tb",
    ]
    .iter()
    .map(|c| c.to_vec())
    .collect();
    callers.push(vec![b'k'; 10 * 1024]);
    callers.push(vec![b'{'; 10 * 1024]);
    // Long callers differing only in the last byte, or only in length.
    let mut last = vec![b'{'; 10 * 1024];
    *last.last_mut().unwrap() = b'}';
    callers.push(last);
    callers.push(vec![b'{'; 10 * 1024 + 1]);
    // Around the hashing threshold (128 escaped bytes), and a short caller
    // that looks like a hashed tag.
    callers.push(vec![b'{'; 42]);
    callers.push(vec![b'{'; 43]);
    callers.push(vec![b'k'; 128]);
    callers.push(vec![b'k'; 129]);
    callers.push(format!("#{}", keys::tag(&[b'{'; 43])[1..].to_owned()).into_bytes());
    let mut all_bytes: Vec<u8> = (0..=255).collect();
    all_bytes.extend((0..=255).rev());
    callers.push(all_bytes);
    callers
}

#[tokio::test(flavor = "multi_thread")]
async fn adversarial_callers_get_distinct_keys_tagged_by_the_whole_caller() {
    let server = RedisServer::start();
    let store = common::redis_rs_store(&server.url(), server.prefix()).await;
    let quotas = [
        Quota::fixed_window(Rate::per_hour(1)).unwrap(),
        Quota::sliding_log(Rate::per_hour(1))
            .unwrap()
            .named("login")
            .unwrap(),
    ];
    let callers = adversarial();
    for q in &quotas {
        let mut seen = HashSet::new();
        for caller in &callers {
            let key = store.key(caller, q);
            assert!(seen.insert(key.clone()), "two callers share {key}");
            let tag = keys::hash_tag(key.as_bytes());
            let tag = std::str::from_utf8(tag).unwrap();
            assert_eq!(tag, keys::tag(caller), "tag of {key}");
            if keys::escaped_len(caller) <= keys::MAX_ESCAPED_CALLER_LEN {
                assert_eq!(
                    keys::unescape(tag).as_deref(),
                    Some(&caller[..]),
                    "tag of {key}"
                );
            } else {
                assert!(tag.starts_with('#') && tag.len() == keys::HASHED_TAG_LEN);
            }
            assert!(key.len() <= keys::MAX_KEY_LEN, "{} bytes", key.len());
            assert!(key.starts_with(&format!("{}:{{", server.prefix())));
            let tail = if q.name() == keys::DEFAULT_POLICY {
                format!("}}:{}", keys::layout_code(q.kind()))
            } else {
                format!("}}:{}:{}", q.name(), keys::layout_code(q.kind()))
            };
            assert!(key.ends_with(&tail), "{key}");
            // Limit 1 per hour: each caller is admitted once, then denied,
            // whatever the others did.
            assert!(
                store.decide_one(caller, q, 1).await.unwrap().allowed,
                "{key}"
            );
        }
        for caller in &callers {
            assert!(!store.decide_one(caller, q, 1).await.unwrap().allowed);
        }
    }
    let stored: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{}:*", server.prefix()))
        .query(&mut server.connection())
        .unwrap();
    // One key per caller for the fixed window, two (times and cumulative
    // costs, one hash tag) for the sliding log.
    assert_eq!(stored.len(), callers.len() * 3);
    // The longest key stored is short: the 10 KB callers are hashed.
    let longest = stored.iter().map(Vec::len).max().unwrap();
    assert!(longest < 200, "longest key {longest} bytes");
}
