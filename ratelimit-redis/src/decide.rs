//! One request's path through the engine ([`Engine::decide`]): checked,
//! admitted by its node's breaker and admission, then sent alone when the
//! node has nothing in flight, or queued for the node's next batch call
//! ([`crate::batch`]); sent once more when the server refused it as expired
//! early in its caller's wait.

use std::sync::Arc;
use std::time::Instant;

use ratelimit_core::StoreError;
use ratelimit_core::health::Permit;
use ratelimit_core::store::{Decisions, Request};

use crate::domains::{Domain, InFlight};
use crate::engine::{Engine, Transport, follow, opened, unavailable};
use crate::scripts::{self, Call};

/// Whether a refusal as expired received at `now`, for a request received
/// at `start` whose caller waits until `deadline`, came back while more than
/// half of that wait (and more than the skew allowance) was still ahead:
/// the mark of a stale server-clock offset (see [`Engine::decide`]).
fn refused_early(start: Instant, deadline: Instant, now: Instant) -> bool {
    let left = deadline.saturating_duration_since(now);
    left > crate::deadline::SKEW_ALLOWANCE && left > deadline.saturating_duration_since(start) / 2
}

impl Engine {
    /// Answers one request: alone (the single-quota script, or a batch of
    /// one for several quotas) when its node has no call in flight, else in
    /// the node's next batch (group commit, described in the crate docs); bounded
    /// by the request's deadline and the engine's timeout, with no fixed
    /// bound of its own on a call's wait for its reply (a slow node that
    /// still answers is busy, not failed; admission keeps its queue short).
    ///
    /// A request the server refused as expired (it wrote nothing) while
    /// more than half of its caller's wait is still ahead (and more than
    /// [`crate::deadline::SKEW_ALLOWANCE`]) is sent once more: the deadline
    /// it carried, in server time, was well before the caller's, so the
    /// offset it was translated by was stale (the server's clock stepped
    /// forward). The refusal carried the server's `TIME`, from which the
    /// offset was learnt again. A request the server reached late because
    /// it was busy is refused near the end of its wait and is not sent
    /// again: a busy server would only be sent more.
    pub async fn decide(
        &self,
        transport: &Arc<dyn Transport>,
        request: Request<'_>,
    ) -> Result<Decisions, StoreError> {
        request.check()?;
        if request.deadline.has_passed() {
            return Err(StoreError::Expired);
        }
        let start = Instant::now();
        // The caller's deadline is the only patience: a request without one
        // (the `StoreExt` shorthands) is bounded by the store's timeout.
        let deadline = request
            .deadline
            .instant_from(start)
            .unwrap_or(start + self.timeout);
        let first = self.attempt(transport, request, start, deadline).await;
        if !(matches!(first, Err(StoreError::Expired))
            && refused_early(start, deadline, Instant::now()))
        {
            return first;
        }
        // Gone before the second attempt: the two attempts' futures and
        // the first's result share their room in this future.
        drop(first);
        tracing::debug!(
            "the server refused a rate-limit call as expired while its caller still waits: \
             its clock offset was stale; sent once more"
        );
        self.attempt(transport, request, Instant::now(), deadline)
            .await
    }

    /// One sending of `request` (received, or sent again, at `start`;
    /// answered by `deadline`): see [`Engine::decide`].
    async fn attempt(
        &self,
        transport: &Arc<dyn Transport>,
        request: Request<'_>,
        start: Instant,
        deadline: Instant,
    ) -> Result<Decisions, StoreError> {
        let now_at = self.now()?;
        // On a cluster the request's keys name its node; a single node's is
        // known at once, and a request its admission refuses is never built.
        let mut built = None;
        let slot = if transport.any_slot() {
            0
        } else {
            let req = scripts::Request::new(&self.prefix, request.key, request.charges, now_at);
            let slot = req.slot();
            built = Some(req);
            slot
        };
        let shared = &self.shared;
        let domain = shared.domains.get(&transport.domain(slot));
        let now = shared.domains.micros(start);
        if let Some(stalls) = domain.confirm_stall(now) {
            opened(
                &domain,
                &format!("{stalls} calls timed out and the node has not replied since"),
            );
        }
        let permit = domain.health().permit(now);
        if let Permit::Open = permit {
            return Err(unavailable(&domain, now));
        }
        let ahead = domain.in_flight();
        if let Err(limit) = domain.admission().admit(ahead, start, deadline) {
            drop(permit);
            // A caller answered at once yields its turn first: callers that
            // ask again as soon as they are answered would otherwise keep
            // their worker for a whole budget of calls each, while the
            // callers whose replies have come wait behind them (and their
            // deadlines pass with the answer ready).
            tokio::task::yield_now().await;
            return Err(crate::admission::overloaded(
                domain.name_arc(),
                ahead,
                Some(limit),
            ));
        }
        if ahead >= u64::try_from(self.max_in_flight).unwrap_or(u64::MAX) {
            return Err(StoreError::message(
                format!(
                    "{} rate-limit calls already wait on {}: refused at once (the memory \
                     safeguard; see ratelimit_redis::engine::DEFAULT_MAX_IN_FLIGHT)",
                    domain.in_flight(),
                    domain.name()
                ),
                true,
            ));
        }
        let mut req = built.unwrap_or_else(|| {
            scripts::Request::on_one_node(&self.prefix, request.key, request.charges, now_at)
        });
        if self.batch_only {
            req = req.through_batch();
        }
        if permit.is_probe() || self.max_batch == 1 || domain.queue().try_lead() {
            // Alone: a probe, or the node has nothing in flight.
            let lead = !permit.is_probe() && self.max_batch > 1;
            let _guard = lead.then(|| crate::batch::Lead::new(self, transport, &domain));
            let in_flight = domain.enter(now);
            self.send_alone(
                transport, &domain, &mut req, start, deadline, permit, in_flight,
            )
            .await
        } else {
            drop(permit);
            crate::batch::enqueue(self, transport, &domain, req, start, deadline).await
        }
    }

    /// Sends one request alone, with its deadline in server time, and
    /// judges the outcome for the node (see the type's docs); learns the
    /// server's clock from the reply. Returns the decisions, or
    /// [`StoreError::Expired`] when the script found the deadline passed.
    /// `start`: when the request was received.
    #[allow(clippy::too_many_arguments)]
    async fn send_alone(
        &self,
        transport: &Arc<dyn Transport>,
        domain: &Arc<Domain>,
        req: &mut scripts::Request,
        start: Instant,
        deadline: Instant,
        permit: Permit<'_>,
        in_flight: InFlight,
    ) -> Result<Decisions, StoreError> {
        let shared = &*self.shared;
        let index = self.clock_index(req.slot());
        let Some(server_deadline) = shared.server_clock.server_deadline(index, deadline) else {
            // Past already: nothing was sent.
            return Err(StoreError::Expired);
        };
        let call = Arc::new(Call::alone_taking_keys(req, server_deadline));
        // The reply is awaited until the caller's deadline, however slow
        // the node: a busy node is not a failed one (a lone call goes as
        // its request arrives: `start`, no second clock read).
        let mut eval = Arc::clone(transport).eval(Arc::clone(&call), deadline);
        let outcome = tokio::time::timeout_at(deadline.into(), &mut eval).await;
        let received = Instant::now();
        if outcome.as_ref().is_ok_and(Result::is_ok) {
            domain
                .admission()
                .call_took(received.saturating_duration_since(start));
        }
        if outcome.is_err() {
            domain.admission().overtaken();
            // The caller gives up; the request may still be answered. Follow
            // it to its reply in the background: that reply is the node's
            // progress (a busy node's replies keep flowing, a stalled one's
            // do not). The call stays in flight until then.
            follow(
                eval,
                Arc::clone(domain),
                shared.domains.clone_base(),
                vec![in_flight],
            );
        } else {
            drop(in_flight);
        }
        let raw = self.judge(
            domain,
            outcome,
            start,
            deadline,
            received,
            permit.is_probe(),
        )?;
        drop(permit);
        self.decode_alone(req, raw, received)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_a_refusal_early_in_the_wait_is_sent_again() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(20);
        // A stale offset: refused at once.
        assert!(refused_early(
            start,
            deadline,
            start + Duration::from_millis(1)
        ));
        // A busy server reached it late: refused near the end of the wait.
        assert!(!refused_early(
            start,
            deadline,
            start + Duration::from_millis(12)
        ));
        assert!(!refused_early(
            start,
            deadline,
            start + Duration::from_millis(19)
        ));
        assert!(!refused_early(start, deadline, deadline));
        // Less than the skew allowance left.
        let short = start + Duration::from_micros(1_500);
        assert!(!refused_early(
            start,
            short,
            start + Duration::from_micros(600)
        ));
    }
}
