//! Section 2, the limiter's overhead: one task, one connection.

use ratelimit_benches::clients::Lib;
use ratelimit_core::AlgorithmKind;
use ratelimit_redis::scripts;

use crate::book::Book;
use crate::contenders::{bare_evalsha, our_keys, ours_limiter, ours_store, ping};
use crate::load::drive;
use crate::options::Args;
use crate::quotas::Quotas;

/// The overhead section runs on its own current-thread runtime: caller,
/// connection driver and socket on one thread, so the differences between
/// contenders are their own CPU time, not cross-thread wake-ups.
pub(crate) fn overhead_run_isolated(a: &Args, q: &Quotas, url: &str, book: &mut Book) {
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(overhead_run(a, q, url, book));
            })
            .join()
            .expect("overhead run");
        });
    });
}

pub(crate) async fn overhead_run(a: &Args, q: &Quotas, url: &str, book: &mut Book) {
    let url = url.to_owned();
    let (k, s) = (a.callers, a.seconds);
    let tb = q.ours(AlgorithmKind::TokenBucket);
    book.add(
        "seq: PING (redis-rs)",
        drive(&ping(&url).await, 1, 1, k, s, None).await,
    );
    for lib in Lib::all() {
        let bare = bare_evalsha(
            lib,
            &url,
            scripts::single(&tb).lua(),
            our_keys(&tb, k),
            scripts::single_args(&tb, None, 1),
            1,
        )
        .await;
        book.add(
            &format!("seq: bare EVALSHA token_bucket ({})", lib.name()),
            drive(&bare, 1, 1, k, s, None).await,
        );
        let st = ours_store(lib, &url, &tb, 1, k).await;
        book.add(
            &format!("seq: RedisStore::decide token_bucket ({})", lib.name()),
            drive(&st, 1, 1, k, s, None).await,
        );
        let lim = ours_limiter(lib, &url, &tb, 1, k).await;
        book.add(
            &format!("seq: Limiter::check token_bucket ({})", lib.name()),
            drive(&lim, 1, 1, k, s, None).await,
        );
    }
}
