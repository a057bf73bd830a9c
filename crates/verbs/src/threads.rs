//! The engine's threads, counted: every thread the engine (and the C ABI
//! above it) starts goes through [`spawn`], so a caller can tell its
//! application's threads from the engine's, even one not yet running (a
//! new thread sets its own name once it runs, so names cannot tell).
//! The C ABI moves registered pages into a shared file only when the
//! calling thread is the application's only one (`ibverbs/src/share.rs`).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Engine threads started and not yet finished.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Held while a thread is counted and created, and while [`app_threads`]
/// counts: a thread is never counted without existing, or the reverse.
static SPAWN: Mutex<()> = Mutex::new(());

/// `std::thread::Builder::new().name(name).spawn(f)`, counted.
pub fn spawn<F, T>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            // Before the thread is gone from /proc: a count then sees one
            // thread too many, never too few.
            LIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _g = SPAWN.lock();
    LIVE.fetch_add(1, Ordering::SeqCst);
    let r = std::thread::Builder::new().name(name).spawn(move || {
        let _d = Done;
        f()
    });
    if r.is_err() {
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
    r
}

/// The process's threads that are not the engine's (an upper bound: an
/// engine thread that is finishing counts as the application's); `None`
/// if `/proc/self/task` cannot be read.
pub fn app_threads() -> Option<usize> {
    let _g = SPAWN.lock();
    let all = std::fs::read_dir("/proc/self/task").ok()?.count();
    Some(all.saturating_sub(LIVE.load(Ordering::SeqCst)))
}
