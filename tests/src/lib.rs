//! Test support for distlock: a real `redis-server` per test ([`RedisServer`]), and a [`Fixture`] that runs
//! one behaviour suite against both backends.

mod fixture;
mod server;

pub use fixture::{eventually, within, Backend, Counter, Fixture};
pub use server::{free_port, RedisServer, INSTALL_HINT};
