//! The nodes' metrics (feature `metrics`, through the `metrics` facade: no
//! exporter is forced on the application). Each is labelled with the node
//! (`host:port`, the failure domain), never with a caller.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `ratelimit_node_in_flight_limit` | gauge | `node` | the requests in flight the node completes within the deadline, as last measured ([`crate::admission`]); 0 while it admits everything (unmeasured, or its estimate forgotten) |
//! | `ratelimit_node_capacity` | gauge | `node` | the node's capacity, requests a second, as last measured while it was saturated (the best sample of the last 100-200 ms); 0 while unmeasured or forgotten |
//! | `ratelimit_node_shed_total` | counter | `node`, `at` (`door`: refused on arrival; `queue`: taken out of the queue unsent) | requests answered at once with `StoreError::Overloaded`, counting nothing |
//! | `ratelimit_node_queue_delay_seconds` | histogram | `node` | per call, how long its oldest request waited in the node's queue |
//!
//! The node's series exist from the moment the store knows the node (the
//! gauges at 0, the counters at 0 for both `at`, the histogram empty): a dashboard shows 0, not
//! "no data", for a node that never shed, and `rate()` sees its first
//! shed.
//!
//! Every store decision the limiter makes from a lease is counted by the
//! core's `ratelimit_decisions_total{source="lease"}`, and every shed
//! request by its `ratelimit_store_failures_total{kind="shed"}`.

use std::time::Duration;

/// The node is known to the store: its series start at 0 (an existing
/// series, from another store on the same node, keeps its value).
pub(crate) fn node(node: &std::sync::Arc<str>) {
    #[cfg(feature = "metrics")]
    {
        let n = || metrics::SharedString::from_shared(std::sync::Arc::clone(node));
        let _ = metrics::gauge!("ratelimit_node_capacity", "node" => n());
        let _ = metrics::gauge!("ratelimit_node_in_flight_limit", "node" => n());
        let _ = metrics::histogram!("ratelimit_node_queue_delay_seconds", "node" => n());
        for at in ["door", "queue"] {
            metrics::counter!("ratelimit_node_shed_total", "node" => n(), "at" => at).increment(0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = node;
}

/// A request was shed at the door or in the queue.
#[inline]
pub(crate) fn shed(node: &std::sync::Arc<str>, at: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratelimit_node_shed_total",
        "node" => metrics::SharedString::from_shared(std::sync::Arc::clone(node)),
        "at" => at
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (node, at);
}

/// A capacity measurement, and the limit in flight it gives for a
/// `deadline` (the caller's time of the latest request).
#[inline]
pub(crate) fn measured(node: &std::sync::Arc<str>, capacity: f64, limit: u64) {
    #[cfg(feature = "metrics")]
    {
        let n = metrics::SharedString::from_shared(std::sync::Arc::clone(node));
        metrics::gauge!("ratelimit_node_capacity", "node" => n.clone()).set(capacity);
        metrics::gauge!("ratelimit_node_in_flight_limit", "node" => n).set(limit as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (node, capacity, limit);
}

/// A call took requests whose oldest had waited `waited` in the queue.
#[inline]
pub(crate) fn queue_delay(node: &std::sync::Arc<str>, waited: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(
        "ratelimit_node_queue_delay_seconds",
        "node" => metrics::SharedString::from_shared(std::sync::Arc::clone(node))
    )
    .record(waited.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (node, waited);
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::time::{Duration, Instant};

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use crate::admission::Admission;

    /// The node's series as `(name, at label, value)`, sorted; a counter as
    /// its increments since the previous snapshot.
    fn series(recorder: &DebuggingRecorder) -> Vec<(String, String, f64)> {
        let mut out: Vec<_> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| {
                k.key()
                    .labels()
                    .any(|l| l.key() == "node" && l.value() == "n1")
            })
            .map(|(k, _, _, v)| {
                let at = k
                    .key()
                    .labels()
                    .find(|l| l.key() == "at")
                    .map_or(String::new(), |l| l.value().to_owned());
                let v = match v {
                    DebugValue::Counter(c) => c as f64,
                    DebugValue::Gauge(g) => g.into_inner(),
                    DebugValue::Histogram(h) => h.len() as f64,
                };
                (k.key().name().to_owned(), at, v)
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }

    /// The node's series as they should read: its capacity and limit in
    /// flight, its queue-delay histogram (no samples) and its sheds.
    fn expected(capacity: f64, limit: f64, door: f64, queue: f64) -> Vec<(String, String, f64)> {
        [
            ("ratelimit_node_capacity", "", capacity),
            ("ratelimit_node_in_flight_limit", "", limit),
            ("ratelimit_node_queue_delay_seconds", "", 0.0),
            ("ratelimit_node_shed_total", "door", door),
            ("ratelimit_node_shed_total", "queue", queue),
        ]
        .into_iter()
        .map(|(name, at, v)| (name.to_owned(), at.to_owned(), v))
        .collect()
    }

    #[test]
    fn a_nodes_series_start_at_zero_and_follow_its_admission() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            let a = Admission::new("n1".into());
            // Known to the store: every series there, at 0.
            assert_eq!(series(&recorder), expected(0.0, 0.0, 0.0, 0.0));
            // Measured at 100,000 a second (no call time yet): a caller
            // with 20 ms gets 3/4 of it, 1,500 in flight; the 1,500th is
            // shed at the door, one more in the queue.
            let now = Instant::now();
            a.measured(1_000, Duration::from_millis(10), now);
            let deadline = now + Duration::from_millis(20);
            assert_eq!(a.admit(1_500, now, deadline), Err(1_500));
            a.shed_queued();
            a.measured(1_000, Duration::from_millis(10), now);
            assert_eq!(series(&recorder), expected(100_000.0, 1_500.0, 1.0, 1.0));
            // The estimate forgotten: the gauges fall to 0 with the next
            // request, which is admitted (nothing more shed: a snapshot
            // gives the counters' increments since the one before).
            let later = now + crate::admission::FORGET_AFTER;
            assert_eq!(
                a.admit(1_000_000, later, later + Duration::from_millis(20)),
                Ok(())
            );
            assert_eq!(series(&recorder), expected(0.0, 0.0, 0.0, 0.0));
        });
    }
}
