//! The store's own I/O thread: the connection to the node, and the tasks
//! that send the node's batch calls and read their replies, on a thread of
//! their own (a single-threaded tokio runtime), apart from the
//! application's runtime.
//!
//! Why: a node's calls are only as prompt as the tasks that send them and
//! read their replies. On the application's runtime those tasks wait their
//! turn among all of its tasks; with thousands of callers, or callers that
//! the store answers at once and that ask again at once, the turn comes
//! milliseconds late, the replies sit unread while the requests' deadlines
//! pass, and the node's useful output falls although the node itself keeps
//! up. On a thread of their own the operating system gives them their
//! share of the CPU whatever the application's runtime does. The callers'
//! own tasks only queue their requests and wait for their answers.
//!
//! One thread per store (clones share it), stopped when the last clone is
//! dropped.

use std::future::Future;
use std::sync::Arc;

/// A running I/O thread (see the module docs); it stops when dropped.
#[derive(Debug)]
pub struct IoThread {
    handle: tokio::runtime::Handle,
    /// Dropping it ends the thread's runtime.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl IoThread {
    /// Starts the thread, named `name`; an error names what failed (the
    /// runtime or the thread could not be made).
    pub fn start(name: &str) -> Result<Arc<Self>, ratelimit_core::StoreError> {
        Self::spawned(name).map_err(|e| {
            ratelimit_core::StoreError::message(
                format!("cannot start the store's I/O thread: {e}"),
                false,
            )
        })
    }

    fn spawned(name: &str) -> std::io::Result<Arc<Self>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Runs the store's tasks until the store is gone.
                let _ = runtime.block_on(stopped);
            })?;
        Ok(Arc::new(Self {
            handle,
            _stop: stop,
        }))
    }

    /// Runs `task` on the thread.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }
}
