//! How the suite asks a store: through its one door, [`Store::decide`], as
//! the [`ratelimit_core::Limiter`] does (a relative deadline, a ready
//! answer taken in place, a pending one awaited), checking what every
//! answer must be: one decision per charge, and ready when the store says
//! it answers in process.

use std::time::Duration;

use ratelimit_core::model::Charge;
use ratelimit_core::store::{Deadline, Decisions, Request};
use ratelimit_core::{Decision, Quota, Store};

/// The deadline the suite gives every ordinary request: relative, as the
/// limiter gives its timeout, and long enough never to pass in a test.
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

/// How long after a request's deadline the suite waits for the answer of a
/// store that reports it bounds its calls
/// ([`ratelimit_core::store::Capabilities::bounded`]) before failing it:
/// the limiter arms no timer of its own for such a store.
pub(crate) const BOUNDED_GRACE: Duration = Duration::from_secs(5);

/// Whether `message` (an error of [`ask`] or [`ask_before`], or a
/// contract's message quoting one) names a broken rule of the door, as
/// opposed to the store's own error: a rule is broken whatever the
/// request.
pub(crate) fn names_a_broken_rule(message: &str) -> bool {
    message.contains(RULE)
}

/// How every broken rule of the door is told.
const RULE: &str = "the store reports that it ";

/// Asks `store` for `charges` on `key`, as the limiter does. `Err` holds
/// what went wrong: the store's error, or a broken rule of the door.
pub(crate) async fn ask(
    store: &dyn Store,
    key: &[u8],
    charges: &[Charge<'_>],
) -> Result<Decisions, String> {
    ask_before(store, key, charges, Deadline::within(DEADLINE)).await
}

/// [`ask`] with the given deadline.
pub(crate) async fn ask_before(
    store: &dyn Store,
    key: &[u8],
    charges: &[Charge<'_>],
    deadline: Deadline,
) -> Result<Decisions, String> {
    let received = std::time::Instant::now();
    let request = Request::new(key, charges).with_deadline(deadline);
    let result = match store.decide(request).into_ready() {
        Ok(result) => result,
        Err(pending) => {
            let caps = store.capabilities();
            if caps.in_process {
                return Err(format!(
                    "{RULE}answers in process (Capabilities::in_process) but answered pending"
                ));
            }
            match deadline.instant_from(received).filter(|_| caps.bounded) {
                // The limiter would wait for this answer with no timer of
                // its own: it must come by the deadline.
                Some(at) => {
                    let until = tokio::time::Instant::from_std(at + BOUNDED_GRACE);
                    match tokio::time::timeout_at(until, pending).await {
                        Ok(result) => result,
                        Err(_) => {
                            return Err(format!(
                                "{RULE}bounds its calls by the request's deadline \
                                 (Capabilities::bounded) but had not answered {BOUNDED_GRACE:?} \
                                 after it"
                            ));
                        }
                    }
                }
                None => pending.await,
            }
        }
    };
    let decisions = result.map_err(|e| format!("the store failed: {e}"))?;
    if decisions.len() != charges.len() {
        return Err(format!(
            "the store answered {} decisions for {} charges (one per charge, all or nothing)",
            decisions.len(),
            charges.len()
        ));
    }
    Ok(decisions)
}

/// One charge of `cost` under `quota`: the single decision.
pub(crate) async fn ask_one(
    store: &dyn Store,
    key: &[u8],
    quota: &Quota,
    cost: u64,
) -> Result<Decision, String> {
    let charges = [Charge::new(quota, cost)];
    let decisions = ask(store, key, &charges).await?;
    decisions
        .into_first()
        .ok_or_else(|| "the store answered no decision".to_owned())
}
