//! A loopback port where connections are refused, for as long as it lives.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A loopback port held by a bound TCP socket that never listens: a
/// connection to it is refused, and no server (another test's, started
/// meanwhile on a port that looked free) can take it while this lives.
/// [`free_port`](crate::free_port) only says a port was free a moment ago.
pub struct RefusedPort {
    port: u16,
    _socket: OwnedFd,
}

impl RefusedPort {
    pub fn new() -> io::Result<RefusedPort> {
        // SAFETY: plain socket calls on a descriptor owned by `socket` from
        // its creation; the address structs are fully initialised.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let socket = OwnedFd::from_raw_fd(fd);
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            address.sin_port = 0;
            let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(
                socket.as_raw_fd(),
                std::ptr::addr_of!(address).cast::<libc::sockaddr>(),
                length,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            let mut bound: libc::sockaddr_in = std::mem::zeroed();
            let mut bound_length = length;
            if libc::getsockname(
                socket.as_raw_fd(),
                std::ptr::addr_of_mut!(bound).cast::<libc::sockaddr>(),
                &mut bound_length,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(RefusedPort {
                port: u16::from_be(bound.sin_port),
                _socket: socket,
            })
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

#[cfg(test)]
mod tests {
    use super::RefusedPort;

    #[test]
    fn connections_are_refused_and_no_server_can_take_it() {
        let refused = RefusedPort::new().unwrap();
        let address = ("127.0.0.1", refused.port());
        let error = std::net::TcpStream::connect(address).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(std::net::TcpListener::bind(address).is_err());
    }
}
