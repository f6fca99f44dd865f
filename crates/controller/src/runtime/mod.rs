//! The controller runtime every controller of cdi-rs runs on: the [`context::Context`] the
//! reconciles share, leader election ([`lease`]), the panic guard ([`guard`]), and one way to run
//! a controller ([`run::run`]): its triggers, its reconcile, and one error policy for all of them,
//! which backs off per object ([`backoff`]) and counts each failure by its kind.

pub mod backoff;
pub mod context;
pub mod error;
pub mod guard;
pub mod lease;
pub mod run;
