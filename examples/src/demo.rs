//! Replays the traffic shapes of the problem against all four algorithms on
//! one store, with a [`ManualClock`], and tabulates what each admitted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::headers::ceil_secs;
use ratelimit_core::{Clock, Limiter, ManualClock, Micros, Quota, Rate, Store};

/// 2026-11-30 12:00:00 UTC, in µs since the epoch: where every scenario starts.
pub const NOON: Micros = 1_796_040_000_000_000;
const SEC: Micros = 1_000_000;
const MINUTE: Micros = 60 * SEC;

/// One request of a scenario: when, and from which client.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Offset from [`NOON`], µs.
    pub at: Micros,
    /// The client (caller key) that sends it.
    pub client: u32,
}

/// A traffic shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// 100 requests at 12:03:59 and 100 at 12:04:00 from one client.
    BoundaryBurst,
    /// A cron job firing 80 requests at the top of every minute for 10 minutes.
    CronAligned,
    /// A steady client at 90% of its plan (90 per minute) for 10 minutes.
    Steady90,
    /// 250 requests at once, each denied one retried a second later, up to 10 times.
    RetryWave,
}

impl Scenario {
    /// Every scenario, in table order.
    pub const ALL: [Scenario; 4] = [
        Self::BoundaryBurst,
        Self::CronAligned,
        Self::Steady90,
        Self::RetryWave,
    ];

    /// The name shown in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::BoundaryBurst => "boundary burst",
            Self::CronAligned => "cron at :00",
            Self::Steady90 => "steady 90%",
            Self::RetryWave => "retry wave",
        }
    }

    /// The requests sent before any decision (the retry wave adds retries as it goes).
    fn initial(self) -> Vec<Request> {
        match self {
            Self::BoundaryBurst => (0..200u64)
                .map(|i| Request {
                    // 100 spread over 12:03:59.000-.099, 100 over 12:04:00.000-.099
                    at: if i < 100 {
                        3 * MINUTE + 59 * SEC + i * 1_000
                    } else {
                        4 * MINUTE + (i - 100) * 1_000
                    },
                    client: 0,
                })
                .collect(),
            Self::CronAligned => (0..10u64)
                .flat_map(|m| {
                    (0..80u64).map(move |i| Request {
                        at: m * MINUTE + i * 10_000,
                        client: 0,
                    })
                })
                .collect(),
            Self::Steady90 => (0..900u64)
                .map(|i| Request {
                    at: i * MINUTE / 90,
                    client: 0,
                })
                .collect(),
            Self::RetryWave => (0..250u64)
                .map(|i| Request {
                    at: i * 100,
                    client: 0,
                })
                .collect(),
        }
    }
}

/// The four algorithms, each configured as "100 per minute" (the token
/// bucket as the plan we sell: 100 per minute, burst 20).
pub fn quotas() -> Vec<Quota> {
    let per_min = Rate::per_minute(100);
    vec![
        Quota::fixed_window(per_min).expect("valid"),
        Quota::sliding_window(per_min).expect("valid"),
        Quota::sliding_log(per_min).expect("valid"),
        Quota::token_bucket(per_min, 20).expect("valid"),
    ]
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The traffic shape.
    pub scenario: Scenario,
    /// The algorithm, as configured.
    pub algorithm: String,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// The most admitted in any trailing 60 s window.
    pub max_trailing_minute: u64,
    /// The time (µs) between the first and last admission of the busiest
    /// trailing minute.
    pub busiest_span: Micros,
    /// What the first denied request was told: `Retry-After` header value and exact wait.
    pub first_retry: Option<(u64, Duration)>,
}

fn label(q: &Quota) -> String {
    match q.kind() {
        ratelimit_core::AlgorithmKind::TokenBucket => "token bucket (100/min, burst 20)".into(),
        k => format!("{k} (100/min)"),
    }
}

/// The largest number admitted in any trailing window `(t - W, t]`, and the
/// span between the first and last of those admissions.
pub fn max_in_trailing(admitted: &[Micros], window: Micros) -> (u64, Micros) {
    let mut q: VecDeque<Micros> = VecDeque::new();
    let (mut best, mut span) = (0u64, 0);
    for &t in admitted {
        q.push_back(t);
        while q.front().is_some_and(|&f| f + window <= t) {
            q.pop_front();
        }
        let n = q.len() as u64;
        if n > best {
            best = n;
            span = t - q.front().copied().unwrap_or(t);
        }
    }
    (best, span)
}

/// Runs one scenario under one quota on `store`, with `clock` driving time.
pub async fn run(
    store: Arc<dyn Store>,
    clock: &ManualClock,
    scenario: Scenario,
    quota: &Quota,
    namespace: &str,
) -> Row {
    // Every decision must come from the store: a failure shows up as a
    // fail-closed denial, which the table would count.
    let limiter = Limiter::builder_arc(store)
        .quota(quota.clone())
        .namespace(namespace)
        .expect("valid namespace")
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .build()
        .expect("valid limiter");
    let mut queue: Vec<(Request, u32)> = scenario.initial().into_iter().map(|r| (r, 0)).collect();
    queue.sort_by_key(|(r, _)| r.at);
    let mut queue: VecDeque<_> = queue.into();
    let (mut admitted, mut denied) = (Vec::new(), 0u64);
    let mut first_retry = None;
    while let Some((req, attempt)) = queue.pop_front() {
        clock.set(NOON + req.at);
        let d = limiter.check(format!("client-{}", req.client)).await;
        if d.allowed {
            admitted.push(req.at);
            continue;
        }
        denied += 1;
        if first_retry.is_none()
            && let Some(exact) = d.retry_after
        {
            first_retry = Some((ceil_secs(exact).max(1), exact));
        }
        if scenario == Scenario::RetryWave && attempt < 10 {
            // The naive client: retry one second later, whatever the server said.
            let retry = (
                Request {
                    at: req.at + SEC,
                    client: req.client,
                },
                attempt + 1,
            );
            let pos = queue.partition_point(|(r, _)| r.at <= retry.0.at);
            queue.insert(pos, retry);
        }
    }
    let (max_trailing_minute, busiest_span) = max_in_trailing(&admitted, MINUTE);
    Row {
        scenario,
        algorithm: label(quota),
        admitted: admitted.len() as u64,
        denied,
        max_trailing_minute,
        busiest_span,
        first_retry,
    }
}

/// Runs every scenario under every algorithm; `store` must take its time
/// from `clock`.
pub async fn run_all(store: Arc<dyn Store>, clock: &ManualClock, run_id: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for (si, scenario) in Scenario::ALL.into_iter().enumerate() {
        for (qi, quota) in quotas().iter().enumerate() {
            let ns = format!("demo-{run_id}-{si}-{qi}");
            rows.push(run(store.clone(), clock, scenario, quota, &ns).await);
        }
    }
    rows
}

/// The table as text.
pub fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<15} {:<34} {:>8} {:>7} {:>22} {:>20}\n",
        "scenario", "algorithm", "admitted", "denied", "max in trailing 60 s", "first Retry-After"
    ));
    out.push_str(&format!("{}\n", "-".repeat(111)));
    for r in rows {
        let busiest = if r.max_trailing_minute > 1 {
            format!(
                "{} (in {:.1} s)",
                r.max_trailing_minute,
                r.busiest_span as f64 / 1e6
            )
        } else {
            r.max_trailing_minute.to_string()
        };
        let retry = match r.first_retry {
            Some((header, exact)) => format!("{header} s ({:.3} s)", exact.as_secs_f64()),
            None => "-".into(),
        };
        out.push_str(&format!(
            "{:<15} {:<34} {:>8} {:>7} {:>22} {:>20}\n",
            r.scenario.name(),
            r.algorithm,
            r.admitted,
            r.denied,
            busiest,
            retry
        ));
    }
    out
}

/// The current time by `clock`, for callers that want a run id.
pub fn run_id(clock: &dyn Clock) -> String {
    format!("{:x}", clock.now())
}
