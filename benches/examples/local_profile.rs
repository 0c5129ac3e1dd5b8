//! A fixed amount of work for a profiler (callgrind, perf): `n` decisions on
//! a set of `keys` callers by one implementation, on one thread.
//!
//! ```text
//! cargo build --profile bench -p ratelimit-benches --example local_profile
//! valgrind --tool=callgrind --toggle-collect='*measured*' \
//!     target/release/examples/local_profile store 1 200000 [plan]
//! ```
//!
//! Only the loop is in `measured` (never inlined), so with
//! `--toggle-collect='*measured*'` callgrind counts the decisions alone,
//! not the set-up (the clock's calibration varies from run to run):
//! instructions per decision are the total divided by `n`.
//!
//! `what` is one of `model`, `store` (a decision through `dyn Store`, the
//! one door, answered in place), `sync` (`LocalStore::decide_now`),
//! `limiter` (`Limiter::check(..).await` in a loop inside one task),
//! `limiter_ready` (`Limiter::check(..).into_ready()`, no runtime),
//! `limiter_await` (`Limiter::check(..).await` in a future polled once),
//! `limiter_boxed` (each check inside its own boxed future polled once, as
//! a tower layer drives it), `governor`; the quota is the admit-everything
//! token bucket of the `local` bench (1e9/s, burst 1000), or with `plan`
//! the sold plan (100 per minute, burst 20).
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;

use governor::RateLimiter;
use ratelimit_benches::{Cursor, caller_ids, decide_in_place, ready};
use ratelimit_core::model::{self, State};
use ratelimit_core::{Limiter, Quota, Rate, Store};
use ratelimit_local::LocalStore;

/// The measured loop: `n` calls of `f` on keys taken in the benches'
/// order; returns how many were admitted.
#[inline(never)]
fn measured(keys: &[String], n: u64, mut f: impl FnMut(&[u8]) -> bool) -> u64 {
    let mut cur = Cursor::new(keys.len(), 0, 1);
    let mut ok = 0;
    for _ in 0..n {
        ok += u64::from(f(keys[cur.next_index()].as_bytes()));
    }
    ok
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("store", String::as_str);
    let n_keys: usize = args.get(2).map_or(1, |s| s.parse().expect("keys"));
    let n: u64 = args
        .get(3)
        .map_or(200_000, |s| s.parse().expect("iterations"));
    let keys = caller_ids(n_keys);
    // `plan` (4th argument): the sold plan, 100 per minute with a burst of
    // 20 (a whole number of µs per token; a hot key is then mostly denied).
    let plan = args.get(4).is_some_and(|s| s == "plan");
    let quota = if plan {
        Quota::token_bucket(Rate::per_minute(100), 20).expect("valid")
    } else {
        Quota::token_bucket(Rate::per_second(1_000_000_000), 1000).expect("valid")
    };
    let governor_quota = if plan {
        governor::Quota::per_minute(NonZeroU32::new(100).expect("nz"))
            .allow_burst(NonZeroU32::new(20).expect("nz"))
    } else {
        governor::Quota::per_second(NonZeroU32::new(1_000_000_000).expect("nz"))
            .allow_burst(NonZeroU32::new(1000).expect("nz"))
    };
    let limiter = || {
        Limiter::builder(LocalStore::new())
            .quota(quota.clone())
            .build()
            .expect("limiter")
    };
    let ok = match what {
        "model" => {
            let mut state: Option<State> = None;
            let mut now = 1_800_000_000_000_000;
            measured(&keys, n, |_| {
                now += 1;
                let step = model::decide(&quota, state.take(), black_box(now), 1).expect("cost");
                state = Some(step.state);
                step.decision.allowed
            })
        }
        "store" => {
            // Through `dyn Store`, as a caller holding a trait object gets it.
            let store: Arc<dyn Store> = Arc::new(LocalStore::new());
            measured(&keys, n, |k| {
                decide_in_place(&*store, k, &quota, 1)
                    .expect("cost")
                    .allowed
            })
        }
        "static_door" => {
            let store = LocalStore::new();
            measured(&keys, n, |k| {
                let charges = [ratelimit_core::Charge::new(&quota, 1)];
                match store
                    .decide(ratelimit_core::store::Request::new(k, &charges))
                    .into_ready()
                {
                    Ok(Ok(ds)) => ds.into_single().map(|d| d.allowed).unwrap_or(false),
                    _ => false,
                }
            })
        }
        "request" => {
            let store = LocalStore::new();
            measured(&keys, n, |k| {
                let charges = [ratelimit_core::Charge::new(&quota, 1)];
                match store.decide_request(ratelimit_core::store::Request::new(k, &charges)) {
                    Ok(ds) => ds.into_single().map(|d| d.allowed).unwrap_or(false),
                    _ => false,
                }
            })
        }
        "sync" => {
            let store = LocalStore::new();
            measured(&keys, n, |k| {
                store.decide_now(k, &quota, 1).expect("cost").allowed
            })
        }
        "limiter" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let limiter = limiter();
            // One task awaiting each check in turn (a plain `.await`).
            rt.block_on(async {
                let mut cur = Cursor::new(keys.len(), 0, 1);
                let mut ok = 0;
                measured_async(&mut ok, n, async |_| {
                    limiter
                        .check(keys[cur.next_index()].as_bytes())
                        .await
                        .allowed
                })
                .await;
                ok
            })
        }
        "limiter_ready" => {
            let limiter = limiter();
            measured(&keys, n, |k| match limiter.check(k).into_ready() {
                Ok(d) => d.allowed,
                Err(_) => panic!("the local store answers in place"),
            })
        }
        "limiter_await" => {
            let limiter = limiter();
            // A plain `.await` of each check inside a future polled once
            // (not boxed): what an `async fn` handler does.
            measured(&keys, n, |k| {
                ready(async { limiter.check(k).await.allowed })
            })
        }
        "limiter_boxed" => {
            let limiter = limiter();
            // As a tower layer drives it: a boxed future per request,
            // polled once.
            measured(&keys, n, |k| {
                let f: Pin<Box<dyn Future<Output = bool> + Send + '_>> =
                    Box::pin(async { limiter.check(k).await.allowed });
                ready(f)
            })
        }
        "governor" => {
            let g = RateLimiter::keyed(governor_quota);
            let keys_owned = keys.clone();
            let mut i = Cursor::new(keys.len(), 0, 1);
            measured(&keys, n, |_| {
                g.check_key(&keys_owned[i.next_index()]).is_ok()
            })
        }
        "sizes" => {
            use ratelimit_core::store::{Answer, Decisions};
            println!(
                "Decision {} Decisions {} StoreError {} Result<Decisions> {} Answer {} Check {}",
                std::mem::size_of::<ratelimit_core::Decision>(),
                std::mem::size_of::<Decisions>(),
                std::mem::size_of::<ratelimit_core::StoreError>(),
                std::mem::size_of::<ratelimit_core::Result<Decisions>>(),
                std::mem::size_of::<Answer<'static>>(),
                std::mem::size_of::<ratelimit_core::Check<'static>>(),
            );
            use ratelimit_core::Decision;
            println!(
                "Decision fields at: allowed {} limit {} remaining {} reset_after {} \
                 retry_after {} source {}",
                std::mem::offset_of!(Decision, allowed),
                std::mem::offset_of!(Decision, limit),
                std::mem::offset_of!(Decision, remaining),
                std::mem::offset_of!(Decision, reset_after),
                std::mem::offset_of!(Decision, retry_after),
                std::mem::offset_of!(Decision, source),
            );
            0
        }
        other => panic!(
            "unknown implementation {other:?}: model, store, sync, limiter, limiter_ready, \
             limiter_await, limiter_boxed or governor"
        ),
    };
    println!("{what}: {ok} of {n} admitted");
}

/// The async counterpart of [`measured`]: `n` awaits of `f` inside one
/// task.
#[inline(never)]
async fn measured_async(ok: &mut u64, n: u64, mut f: impl AsyncFnMut(u64) -> bool) {
    for i in 0..n {
        *ok += u64::from(f(i).await);
    }
}
