//! Functions run on events (issue 42, docs/plans/events.md): a broker's messages delivered
//! to a Function as HTTP requests in the CloudEvents binary mode, acknowledged only after a
//! 2xx, retried with growing delays, and parked as dead letters when they keep failing.
//!
//! A delivery passes through short named steps: [`deliver::deliver_all`] takes a trigger's
//! messages from the [`broker`], [`cloudevent::request`] makes each one's request,
//! [`deliver::send`] sends it, [`retry::decide`] says what the answer means, and the broker
//! is told (ack, retry after a delay, or give up after parking a dead letter).

pub mod broker;
pub mod cloudevent;
pub mod credentials;
pub mod deliver;
pub mod endpoints;
pub mod function;
pub mod identity;
pub mod ingress;
pub mod journal;
pub mod metrics;
pub mod names;
pub mod report;
pub mod retry;
pub mod running;
pub mod schedule;
pub mod watch;
