//! [`FaultProxy`]: a loopback TCP proxy in front of a Redis server that injects network faults on demand.
//!
//! A client built on [`FaultProxy::url`] talks to the server through the proxy; the test switches the
//! [`Fault`] at run time. Faults keep TCP's semantics where a real network keeps them: bytes are held or
//! delayed, never dropped from the middle of a live stream, except in [`Fault::DropReplies`], after which the
//! connection is reset (a lost reply on a real network means a broken connection).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything at once.
    Pass,
    /// Forward every chunk, in both directions, this long after it arrived (a round trip gains twice this).
    Delay(Duration),
    /// A partition: hold every byte (both directions, live and new connections) until the fault changes, then
    /// deliver it, as TCP retransmission would after the network heals.
    Blackhole,
    /// Requests reach the server; its replies are thrown away. A connection that lost a reply is reset when
    /// the fault changes to anything else.
    DropReplies,
    /// Reset (RST) every live connection, and every new one as soon as it is accepted.
    Reset,
    /// Refuse new connections (the port is closed); live connections pass traffic.
    Refuse,
}

/// Counters, for assertions on what the proxy saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections reset by the proxy.
    pub reset: u64,
    /// Reply bytes thrown away in [`Fault::DropReplies`].
    pub dropped_reply_bytes: u64,
}

/// A TCP proxy on a free loopback port, forwarding to `upstream`. Dropping it stops accepting and closes
/// every connection.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

struct Shared {
    /// The fault given to connections accepted from now on; the acceptor watches it for `Refuse`.
    default: watch::Sender<Fault>,
    /// Where connections accepted from now on are forwarded (switched to simulate a failover).
    upstream: watch::Sender<SocketAddr>,
    conns: Mutex<Vec<Weak<ConnCtl>>>,
    accepted: AtomicU64,
    reset: AtomicU64,
    dropped: AtomicU64,
}

struct ConnCtl {
    /// Its place in the order of acceptance: 0 for the first connection the proxy accepted.
    ordinal: u64,
    fault: watch::Sender<Fault>,
    /// A one-shot reset, independent of the fault.
    kill: watch::Sender<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Request,
    Reply,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// One side closed or failed: close both gracefully.
    Closed,
    /// Reset both sides.
    Reset,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (a loopback address) in [`Fault::Pass`].
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await;
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            default: watch::Sender::new(Fault::Pass),
            upstream: watch::Sender::new(upstream),
            conns: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let acceptor = tokio::spawn(accept_loop(listener, addr, Arc::clone(&shared)));
        Self { addr, shared, acceptor }
    }

    /// A proxy in front of `redis://127.0.0.1:<port>/`.
    pub async fn to_port(port: u16) -> Self {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await
    }

    /// `redis://127.0.0.1:<proxy port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards new connections to.
    pub fn upstream(&self) -> SocketAddr {
        *self.shared.upstream.borrow()
    }

    /// Forwards new connections to `upstream` from now on (live ones keep theirs: reset them to move them),
    /// as a failover moves a service address to the promoted replica.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        self.shared.upstream.send_replace(upstream);
    }

    /// Switches every live connection, and every later one, to `fault`.
    pub fn set_fault(&self, fault: Fault) {
        self.shared.default.send_replace(fault);
        for conn in self.live() {
            conn.fault.send_replace(fault);
        }
    }

    /// Switches only the connections accepted from now on to `fault`; live connections keep theirs. E.g.
    /// [`Fault::Blackhole`] here lets an existing connection work while any new one hangs.
    pub fn set_fault_for_new_connections(&self, fault: Fault) {
        self.shared.default.send_replace(fault);
    }

    /// Switches only the connection the proxy accepted `ordinal`-th (0 for the first; see
    /// [`ProxyStats::accepted`]) to `fault`, if it is still open; every other connection, and the fault new
    /// ones get, is left alone. E.g. a client's command connection loses its replies while its subscriber
    /// connection keeps working. Whether that connection was open.
    pub fn set_connection_fault(&self, ordinal: u64, fault: Fault) -> bool {
        let conn = self.live().into_iter().find(|c| c.ordinal == ordinal);
        conn.map(|c| c.fault.send_replace(fault)).is_some()
    }

    /// The fault new connections get.
    pub fn fault(&self) -> Fault {
        *self.shared.default.borrow()
    }

    /// Resets (RST) every live connection once; the fault is unchanged.
    pub fn reset_all(&self) {
        for conn in self.live() {
            conn.kill.send_replace(true);
        }
    }

    /// How many connections are open through the proxy.
    pub fn live_connections(&self) -> usize {
        self.live().len()
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            accepted: self.shared.accepted.load(Ordering::SeqCst),
            reset: self.shared.reset.load(Ordering::SeqCst),
            dropped_reply_bytes: self.shared.dropped.load(Ordering::SeqCst),
        }
    }

    fn live(&self) -> Vec<Arc<ConnCtl>> {
        let mut conns = self.shared.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.retain(|c| c.strong_count() > 0);
        conns.iter().filter_map(Weak::upgrade).collect()
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream())
            .field("fault", &self.fault())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        for conn in self.live() {
            conn.kill.send_replace(true);
        }
    }
}

async fn bind(addr: SocketAddr) -> TcpListener {
    let mut last = None;
    // Rebinding a port the proxy closed a moment ago (Refuse) may race with its own lingering sockets.
    for _ in 0..100 {
        let socket = TcpSocket::new_v4().expect("TCP socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        match socket.bind(addr).and_then(|()| socket.listen(128)) {
            Ok(listener) => return listener,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fault proxy cannot listen on {addr}: {last:?}")
}

async fn accept_loop(mut listener: TcpListener, addr: SocketAddr, shared: Arc<Shared>) {
    let mut default = shared.default.subscribe();
    loop {
        if *default.borrow_and_update() == Fault::Refuse {
            drop(listener);
            while *default.borrow_and_update() == Fault::Refuse {
                if default.changed().await.is_err() {
                    return;
                }
            }
            listener = bind(addr).await;
            continue;
        }
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let ordinal = shared.accepted.fetch_add(1, Ordering::SeqCst);
                let fault = *default.borrow();
                let ctl = Arc::new(ConnCtl {
                    ordinal,
                    fault: watch::Sender::new(fault),
                    kill: watch::Sender::new(false),
                });
                shared.conns.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(&ctl));
                let upstream = *shared.upstream.borrow();
                tokio::spawn(serve(client, upstream, ctl, Arc::clone(&shared)));
            }
            changed = default.changed() => if changed.is_err() { return },
        }
    }
}

fn reset(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_zero_linger();
    shared.reset.fetch_add(1, Ordering::SeqCst);
    drop(stream);
}

async fn serve(client: TcpStream, upstream: SocketAddr, ctl: Arc<ConnCtl>, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    if *ctl.fault.borrow() == Fault::Reset {
        reset(client, &shared);
        return;
    }
    let server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(_) => {
            reset(client, &shared);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let tainted = AtomicBool::new(false);
    let end = tokio::select! {
        end = pump(&mut client_rx, &mut server_tx, Dir::Request, ctl.fault.subscribe(), &tainted, &shared) => end,
        end = pump(&mut server_rx, &mut client_tx, Dir::Reply, ctl.fault.subscribe(), &tainted, &shared) => end,
        end = watch_control(&ctl, &tainted) => end,
    };
    if end == End::Reset {
        if let Ok(client) = client_rx.reunite(client_tx) {
            reset(client, &shared);
        }
        if let Ok(server) = server_rx.reunite(server_tx) {
            let _ = server.set_zero_linger();
        }
    }
}

/// Ends the connection with a reset on `reset_all`, on `Fault::Reset`, and when a connection that lost a
/// reply leaves `Fault::DropReplies`.
async fn watch_control(ctl: &ConnCtl, tainted: &AtomicBool) -> End {
    let mut fault = ctl.fault.subscribe();
    let mut kill = ctl.kill.subscribe();
    loop {
        if *kill.borrow_and_update() {
            return End::Reset;
        }
        let now = *fault.borrow_and_update();
        if now == Fault::Reset || (now != Fault::DropReplies && tainted.load(Ordering::SeqCst)) {
            return End::Reset;
        }
        tokio::select! {
            _ = fault.changed() => {}
            _ = kill.changed() => {}
        }
    }
}

async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    dir: Dir,
    mut fault: watch::Receiver<Fault>,
    tainted: &AtomicBool,
    shared: &Shared,
) -> End {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        let arrived = Instant::now();
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::Pass | Fault::Refuse => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return End::Closed;
                    }
                    break;
                }
                Fault::Delay(delay) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(arrived + delay) => {
                            if to.write_all(&buf[..n]).await.is_err() {
                                return End::Closed;
                            }
                            break;
                        }
                        // Re-decide under the new fault (e.g. healed: send now).
                        changed = fault.changed() => if changed.is_err() { return End::Closed },
                    }
                }
                Fault::Blackhole => {
                    if fault.changed().await.is_err() {
                        return End::Closed;
                    }
                }
                Fault::DropReplies if dir == Dir::Reply => {
                    tainted.store(true, Ordering::SeqCst);
                    shared.dropped.fetch_add(n as u64, Ordering::SeqCst);
                    break;
                }
                Fault::DropReplies => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return End::Closed;
                    }
                    break;
                }
                Fault::Reset => return End::Reset,
            }
        }
    }
}
