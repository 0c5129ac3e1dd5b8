//! The conformance suite: contracts 1-14 of the design, checked for any store.
//!
//! Every function takes a [`StoreFactory`] and a [`SuiteConfig`], runs
//! proptest-generated sequences of `(time, key, policy, cost)` calls against
//! stores from the factory, and returns the first [`Violation`] found, with
//! the contract it breaks and the (shrunk) failing sequence.
//!
//! The functions must run inside a **multi-threaded** tokio runtime
//! (`#[tokio::test(flavor = "multi_thread")]`): proptest's runner is
//! synchronous and each case drives the async store with
//! `block_in_place` + `Handle::block_on`; the concurrency contract calls the
//! stores from OS threads of its own.
//!
//! The trailing-window checks (contracts 2-5) are computed by brute force over
//! the log of admitted calls; they do not reuse the model's arithmetic.

mod atomic;
mod capacity;
mod checks;
mod concurrency;
mod deadlines;
mod door;
mod oracle;
mod requests;
mod scenario;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::{ManualClock, Store};

pub use atomic::quotas_atomic;
pub use capacity::capacity;
pub use checks::{
    fixed_window_bound, keys_isolated, model_agreement, retry_after_exact, sliding_log_exact,
    sliding_window_rule, state_expires, token_bucket_bound,
};
pub use concurrency::{
    ConcurrencyReport, concurrency, concurrency_costs, concurrency_report,
    concurrency_server_clock, concurrency_sets, shared_state,
};
pub use deadlines::deadlines;
pub use requests::{no_deadline, refusals};

/// Makes the stores under test.
///
/// ```
/// use std::sync::Arc;
/// use ratelimit_core::{ManualClock, Store, SystemClock};
/// use ratelimit_local::LocalStore;
/// use ratelimit_testkit::StoreFactory;
///
/// struct Local;
///
/// #[async_trait::async_trait]
/// impl StoreFactory for Local {
///     async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
///         // One in-process map: every "instance" is the same store.
///         let store: Arc<dyn Store> = match clock {
///             Some(c) => Arc::new(LocalStore::with_clock(c)),
///             None => Arc::new(LocalStore::with_clock(SystemClock)),
///         };
///         vec![store; n]
///     }
/// }
/// ```
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// `n` store instances sharing one backend, each on its own connection
    /// where the backend has connections (as separate app servers would).
    ///
    /// `clock`: `Some` → the stores take "now" from it (the suite moves it);
    /// `None` → the backend's own clock (Redis `TIME`, the system clock).
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>>;
}

/// The environment variable that sets the number of proptest cases per
/// property for every configuration (for a deeper run than CI's).
pub const CASES_ENV: &str = "RATELIMIT_SUITE_CASES";

/// The environment variable that sets the proptest seed (to explore other
/// sequences than CI's fixed one).
pub const SEED_ENV: &str = "RATELIMIT_SUITE_SEED";

/// How hard the suite tries.
///
/// Two presets: [`SuiteConfig::in_process`] for stores that answer in
/// microseconds (1,024 cases per property) and [`SuiteConfig::network`]
/// (the default: 64 cases) for stores behind a network round trip. Both
/// honour [`CASES_ENV`] and [`SEED_ENV`].
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// Proptest cases per property (fixed so CI is reproducible).
    pub cases: u32,
    /// Proptest RNG seed (default fixed; set another to explore).
    pub seed: u64,
    /// Store instances in the shared-state and concurrency contracts (default 4).
    pub instances: usize,
    /// OS threads per instance in the concurrency contract (default 2).
    pub threads_per_instance: usize,
    /// Rounds of the concurrency contract per algorithm, each on a fresh key.
    pub concurrency_rounds: u32,
    /// The limit of the concurrency contract's quotas (each round makes
    /// twice as many calls).
    pub concurrency_limit: u64,
    /// Wall-clock bound of the server-clock concurrency run (default 2 s).
    pub concurrency_duration: Duration,
    /// Whether [`run_all`] also runs the server-clock concurrency check
    /// (default true; a store without its own clock would use the system clock).
    pub server_clock: bool,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        Self::network()
    }
}

impl SuiteConfig {
    /// For stores behind a network round trip: 64 cases per property, 4
    /// concurrency rounds per algorithm.
    pub fn network() -> Self {
        Self {
            cases: 64,
            seed: 0x5EED_2026,
            instances: 4,
            threads_per_instance: 2,
            concurrency_rounds: 4,
            concurrency_limit: 256,
            concurrency_duration: Duration::from_secs(2),
            server_clock: true,
        }
        .with_env()
    }

    /// For in-process stores: 1,024 cases per property, 16 concurrency
    /// rounds per algorithm.
    pub fn in_process() -> Self {
        Self {
            cases: 1024,
            concurrency_rounds: 16,
            ..Self::network()
        }
        .with_env()
    }

    /// Applies [`CASES_ENV`] and [`SEED_ENV`] when set.
    ///
    /// # Panics
    ///
    /// When either is set to something that is not a number.
    pub fn with_env(mut self) -> Self {
        if let Ok(v) = std::env::var(CASES_ENV) {
            self.cases = v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{CASES_ENV}={v:?} is not a number of cases"));
        }
        if let Ok(v) = std::env::var(SEED_ENV) {
            self.seed = v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={v:?} is not a number"));
        }
        self
    }

    /// Cases for the costlier properties (several stores per case): a
    /// quarter of [`SuiteConfig::cases`], at least 16.
    pub(crate) fn fewer_cases(&self) -> u32 {
        (self.cases / 4).max(16).min(self.cases.max(1))
    }
}

/// The contracts of the design (section 4), 1-11, and 12-14, which check
/// the requests a store author might not think of: none with a deadline,
/// ones that must be refused, more callers than a bounded store keeps.
/// Contract 9 has two parts: [`shared_state`], and [`concurrency`] (with
/// [`concurrency_costs`], [`concurrency_sets`] and
/// [`concurrency_server_clock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contract {
    /// 1: decisions equal the core model's, call for call.
    ModelAgreement = 1,
    /// 2: fixed window admits at most L per calendar window, and whenever the count allows.
    FixedWindow = 2,
    /// 3: sliding window counter admits iff the weighted rule holds.
    SlidingWindow = 3,
    /// 4: sliding log admits at most L in every trailing window, without false denials.
    SlidingLog = 4,
    /// 5: token bucket admits at most capacity + rate·T in any span T.
    TokenBucket = 5,
    /// 6: the same call at now + retry_after is admitted; one tick earlier it is not.
    RetryAfter = 6,
    /// 7: traffic on one key never changes another key's decisions.
    KeyIsolation = 7,
    /// 8: after the derived TTL the next call behaves as on a fresh key, and not before.
    StateExpires = 8,
    /// 9 (shared state): instances called round-robin admit what one instance would.
    SharedState = 90,
    /// 9 (concurrency): many threads over many instances on one key never
    /// over-admit, with one quota or several.
    Concurrency = 9,
    /// 10: a request carried out after its deadline counts nothing.
    Deadline = 10,
    /// 11: with several quotas, a call is admitted only if every quota
    /// admits it, and a denied call is counted in no quota.
    Atomicity = 11,
    /// 12: a request with no deadline is decided as any other.
    NoDeadline = 12,
    /// 13: a request `Request::check` refuses is refused with an error and
    /// counts nothing.
    Refusals = 13,
    /// 14: a store that reports a bound on its callers, when full, refuses
    /// a new caller and never forgets a tracked one to make room.
    Capacity = 14,
}

impl Contract {
    /// The contract's number in the design (9 for both parts of contract 9).
    pub const fn number(self) -> u8 {
        match self {
            Self::SharedState => 9,
            other => other as u8,
        }
    }
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::ModelAgreement => "model agreement",
            Self::FixedWindow => "fixed window bound",
            Self::SlidingWindow => "sliding window counter rule",
            Self::SlidingLog => "sliding log exactness",
            Self::TokenBucket => "token bucket bound",
            Self::RetryAfter => "Retry-After is exact",
            Self::KeyIsolation => "keys are isolated",
            Self::StateExpires => "state expires",
            Self::SharedState => "shared state",
            Self::Concurrency => "concurrency",
            Self::Deadline => "nothing counted after the deadline",
            Self::Atomicity => "several quotas, all or nothing",
            Self::NoDeadline => "requests without a deadline",
            Self::Refusals => "refused requests count nothing",
            Self::Capacity => "a full store forgets no one",
        };
        write!(f, "contract {} ({name})", self.number())
    }
}

/// A broken contract: which, what happened, and the sequence that shows it.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The contract broken.
    pub contract: Contract,
    /// What went wrong.
    pub message: String,
    /// The (shrunk) failing input: quota and calls.
    pub sequence: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} violated: {}\nfailing sequence:\n{}",
            self.contract, self.message, self.sequence
        )
    }
}

impl std::error::Error for Violation {}

/// Runs every contract, 1 to 14, and returns the first violation: 1-8,
/// 9 ([`shared_state`], [`concurrency`], [`concurrency_costs`] for costs
/// above 1, and [`concurrency_sets`] for several quotas at once), 10
/// ([`deadlines`]: an expired request counts nothing), 11
/// ([`quotas_atomic`]: several quotas all or nothing, on the same states as
/// single quotas), 12 ([`no_deadline`]: requests without a deadline), 13
/// ([`refusals`]: a request `Request::check` refuses counts nothing) and 14
/// ([`capacity`]: a store that reports a bound on its callers, when full,
/// refuses new ones and forgets none; passed at once by a store that
/// reports none). Every request goes through the store's one door,
/// [`Store::decide`], as the limiter sends it (contract 12 also with no
/// deadline).
///
/// Contracts 1-8, shared state and the exact concurrency check run on an
/// injected clock; when `config.server_clock` is set, a second concurrency
/// check runs on the stores' own clock.
pub async fn run_all(factory: &dyn StoreFactory, config: &SuiteConfig) -> Result<(), Violation> {
    model_agreement(factory, config).await?;
    fixed_window_bound(factory, config).await?;
    sliding_window_rule(factory, config).await?;
    sliding_log_exact(factory, config).await?;
    token_bucket_bound(factory, config).await?;
    retry_after_exact(factory, config).await?;
    keys_isolated(factory, config).await?;
    state_expires(factory, config).await?;
    shared_state(factory, config).await?;
    concurrency(factory, config).await?;
    concurrency_costs(factory, config).await?;
    if config.server_clock {
        concurrency_server_clock(factory, config).await?;
    }
    deadlines(factory, config).await?;
    quotas_atomic(factory, config).await?;
    concurrency_sets(factory, config).await?;
    no_deadline(factory, config).await?;
    refusals(factory, config).await?;
    capacity(factory, config).await?;
    Ok(())
}
