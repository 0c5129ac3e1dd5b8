//! The configuration watch, in process: a change made before the watch's
//! own task first runs is still seen (the files' state is read when the
//! watch starts, not in that task, which would take the new contents for
//! the old and skip the change as none). On a one-thread runtime the
//! watch's task runs only once the test awaits, so the file is changed in
//! exactly that gap.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ratelimit_server::config::{Config, LoadOptions};
use ratelimit_server::server::watch_config;
use ratelimit_server::{RateLimitService, Settings};

use common::{config_file, temp_dir};

fn limit(service: &RateLimitService) -> Option<u32> {
    service
        .config()
        .lookup("edge", &[("remote_address", "10.0.0.1")], None)
        .map(|f| f.limit.requests_per_unit)
}

#[test]
fn a_change_before_the_watch_task_first_runs_is_reloaded() {
    let dir = temp_dir("watch-gap");
    let path = config_file(&dir, 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let paths = vec![path];
        let config = Config::load(&paths, LoadOptions::default()).expect("load");
        let store = Arc::new(ratelimit_local::LocalStore::new());
        let service = Arc::new(
            RateLimitService::new(store, config, Settings::default(), "local")
                .expect("service settings"),
        );
        assert_eq!(limit(&service), Some(2));
        let _watch = watch_config(service.clone(), paths, LoadOptions::default()).expect("watch");
        // No await since the watch started: its task has not run yet.
        config_file(&dir, 50);
        // Bounded: the reload comes about 100 ms after the file's events.
        for _ in 0..200 {
            if limit(&service) == Some(50) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the change made before the watch's task first ran was never reloaded");
    });
}
