//! The nodes' metrics (feature `metrics`, through the `metrics` facade: no
//! exporter is forced on the application). Each is labelled with the node
//! (`host:port`, the failure domain), never with a caller.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `ratelimit_node_in_flight_limit` | gauge | `node` | the requests in flight the node completes within the deadline, as last measured ([`crate::admission`]); 0 while it admits everything |
//! | `ratelimit_node_capacity` | gauge | `node` | the node's capacity, requests a second, as last measured while it was backlogged |
//! | `ratelimit_node_shed_total` | counter | `node`, `at` (`door`: refused on arrival; `queue`: taken out of the queue unsent) | requests answered at once with `StoreError::Overloaded`, counting nothing |
//! | `ratelimit_node_queue_delay_seconds` | histogram | `node` | per call, how long its oldest request waited in the node's queue |
//!
//! Every store decision the limiter makes from a lease is counted by the
//! core's `ratelimit_decisions_total{source="lease"}`, and every shed
//! request by its `ratelimit_store_failures_total{kind="shed"}`.

use std::time::Duration;

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
