//! The engine's threads are counted apart from the application's
//! (`softrdma_verbs::threads`). One test in its own process: the test
//! harness's other tests would be threads of the process too.

#[test]
fn an_engine_thread_is_not_counted_as_the_applications() {
    use softrdma_verbs::threads::{app_threads, spawn};
    let before = app_threads().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    // Counted from its creation: at once, whether it runs yet or not.
    let t = spawn("softrdma-test".into(), move || rx.recv().ok()).unwrap();
    assert_eq!(app_threads().unwrap(), before);
    let (tx2, rx2) = std::sync::mpsc::channel::<()>();
    let plain = std::thread::spawn(move || rx2.recv().ok());
    assert_eq!(app_threads().unwrap(), before + 1);
    drop((tx, tx2));
    t.join().unwrap();
    plain.join().unwrap();
}
