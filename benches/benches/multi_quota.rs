//! Several quotas per call on the local store: one decision over 1, 2 and 3
//! quotas through `Limiter::check_all`, all or nothing, in the same run.
//!
//! `cargo bench -p ratelimit-benches --bench multi_quota`; see `BENCHMARKS.md`.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratelimit_core::{Limiter, Quota, Rate};
use ratelimit_local::LocalStore;
use tokio::runtime::Runtime;

fn quotas() -> Vec<Quota> {
    // Large limits: the callers below are always admitted, so every call
    // reads, decides and writes every quota.
    vec![
        Quota::token_bucket(Rate::per_second(1_000_000), 1_000_000)
            .and_then(|q| q.named("second"))
            .unwrap(),
        Quota::sliding_window(Rate::per_minute(10_000_000))
            .and_then(|q| q.named("minute"))
            .unwrap(),
        Quota::fixed_window(Rate::per_day(1_000_000_000))
            .and_then(|q| q.named("day"))
            .unwrap(),
    ]
}

fn several_quotas(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let mut group = c.benchmark_group("quotas_per_call");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    let callers: Vec<String> = (0..1_000).map(|i| format!("caller-{i}")).collect();
    for n in 1..=3 {
        let mut b = Limiter::builder(LocalStore::new());
        for q in quotas().into_iter().take(n) {
            b = b.quota(q);
        }
        let limiter = b.build().unwrap();
        group.bench_function(
            format!("{n}_quota{}", if n > 1 { "s" } else { "" }),
            |bench| {
                bench.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for i in 0..iters {
                            let caller = &callers[(i % 1_000) as usize];
                            black_box(limiter.check_all(caller, 1).await.unwrap());
                        }
                        start.elapsed()
                    })
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, several_quotas);
criterion_main!(benches);
