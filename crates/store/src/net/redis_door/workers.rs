//! The door's workers: threads that serve a connection away from the
//! event loop (`event_loop.rs`) while a command of it may wait, and what
//! moves between the loop and them.

use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use mio::Waker;

use super::fast::Pending;
use super::session::{Out, Session};
use crate::proto::{self, StoreError};
use crate::resp_codec::Decoder;

/// What comes back to the loop.
pub(super) enum Back {
    /// The node loop's answer to write `req_id` of connection `no`.
    Answer {
        no: u64,
        req_id: u64,
        result: Result<proto::Reply, StoreError>,
    },
    /// A connection a worker served.
    Served(Box<Away>),
}

/// What moves between the loop and a worker.
pub(super) struct Parts {
    pub(super) stream: TcpStream,
    pub(super) session: Session,
    pub(super) out: Out,
    pub(super) decoder: Decoder,
    /// Bytes read and not yet decoded.
    pub(super) input: Vec<u8>,
}

/// A connection while a worker has it, and what the worker is to do.
pub(super) struct Away {
    pub(super) no: u64,
    pub(super) parts: Parts,
    pub(super) work: Work,
    /// Set by the worker: the connection is done.
    pub(super) close: bool,
}

pub(super) enum Work {
    /// A command the loop would not run.
    Command(Vec<Vec<u8>>),
    /// A write of the loop to ask again through a client.
    Retry(Pending, Option<Result<proto::Reply, StoreError>>),
}

/// The threads that serve connections away from the loop.
pub(super) struct Workers {
    jobs: Sender<Box<Away>>,
    queue: Arc<Mutex<Receiver<Box<Away>>>>,
    /// Workers waiting for a job and not yet promised one.
    idle: Arc<AtomicUsize>,
    back: Sender<Back>,
    waker: Arc<Waker>,
}

impl Workers {
    pub(super) fn new(back: Sender<Back>, waker: Arc<Waker>) -> Workers {
        let (jobs, queue) = mpsc::channel();
        Workers {
            jobs,
            queue: Arc::new(Mutex::new(queue)),
            idle: Arc::new(AtomicUsize::new(0)),
            back,
            waker,
        }
    }

    /// Hands `away` to a worker: an idle one if there is one, else a new
    /// one (a job never waits behind a worker that is busy: one may block
    /// for as long as its command does).
    pub(super) fn run(&self, away: Box<Away>) {
        let claimed = self
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |i| i.checked_sub(1))
            .is_ok();
        if !claimed {
            let (queue, idle) = (self.queue.clone(), self.idle.clone());
            let (back, waker) = (self.back.clone(), self.waker.clone());
            let spawned = std::thread::Builder::new()
                .name("store-resp-work".into())
                .spawn(move || worker(queue, idle, back, waker));
            if let Err(e) = spawned {
                // Without a thread the connection cannot be served: it is
                // handed back closed.
                tracing::warn!("RESP worker: {e}");
                let mut away = away;
                away.close = true;
                let _ = self.back.send(Back::Served(away));
                let _ = self.waker.wake();
                return;
            }
        }
        let _ = self.jobs.send(away);
    }
}

fn worker(
    queue: Arc<Mutex<Receiver<Box<Away>>>>,
    idle: Arc<AtomicUsize>,
    back: Sender<Back>,
    waker: Arc<Waker>,
) {
    loop {
        let job = queue.lock().expect("jobs").recv();
        let Ok(mut away) = job else {
            return;
        };
        let served =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve_away(&mut away)));
        if served.is_err() {
            tracing::error!(
                "RESP connection {}: a command panicked; connection closed",
                away.no
            );
            away.close = true;
        }
        // Idle again before the connection goes back, so the loop finds
        // this worker for the next job.
        idle.fetch_add(1, Ordering::AcqRel);
        if back.send(Back::Served(away)).is_err() {
            return;
        }
        let _ = waker.wake();
    }
}

/// Runs a connection's work as a thread per connection would: the socket
/// blocking, each reply written as it comes.
fn serve_away(away: &mut Away) {
    let p = &mut away.parts;
    let writer = p
        .stream
        .set_nonblocking(false)
        .and_then(|()| p.stream.try_clone());
    let Ok(writer) = writer else {
        away.close = true;
        return;
    };
    p.out.conn = Some(Box::new(writer));
    p.out.flush();
    let mut close = false;
    match std::mem::replace(&mut away.work, Work::Command(Vec::new())) {
        Work::Command(args) => close = p.session.exec(&args, &mut p.out),
        Work::Retry(pending, first) => {
            let reply = p.session.answer_slow(pending, first);
            p.out.reply(&reply);
        }
    }
    if !close && !p.out.broken {
        let (used, c) = p.session.serve_bytes(&mut p.decoder, &p.input, &mut p.out);
        p.input.drain(..used);
        close = c;
    }
    p.out.flush();
    p.out.conn = None;
    away.close = close || p.out.broken || p.stream.set_nonblocking(true).is_err();
}
