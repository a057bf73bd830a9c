//! The engine's errors as the errno a kernel provider returns for the same
//! misuse (`siw`, `rxe`: EINVAL for a bad argument or state, ENOMEM when a
//! queue or table is full, ECONNREFUSED for a rejected connection).

use softrdma_verbs::Error;

pub fn of(e: &Error) -> i32 {
    match e {
        Error::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        Error::InvalidArgument(_) => libc::EINVAL,
        Error::Exhausted(_) => libc::ENOMEM,
        Error::StagInUse(_) => libc::EBUSY,
        Error::BadState { .. } => libc::EINVAL,
        Error::SendQueueFull | Error::RecvQueueFull => libc::ENOMEM,
        Error::Rejected { .. } => libc::ECONNREFUSED,
        Error::Protocol(_) => libc::EPROTO,
        Error::Timeout(_) => libc::ETIMEDOUT,
        Error::Terminated(_) => libc::ECONNRESET,
        Error::Closed => libc::ENODEV,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_what_a_provider_returns() {
        assert_eq!(of(&Error::SendQueueFull), libc::ENOMEM);
        assert_eq!(
            of(&Error::BadState {
                qpn: 1,
                state: softrdma_verbs::QpState::Reset
            }),
            libc::EINVAL
        );
        assert_eq!(
            of(&Error::Io(std::io::Error::from_raw_os_error(
                libc::ECONNREFUSED
            ))),
            libc::ECONNREFUSED
        );
    }
}
