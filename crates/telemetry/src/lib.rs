//! Fleet telemetry shared by the relay-agent, the proxy and the testbed.
//!
//! - [`v1`]: the telemetry record schema (`schema/telemetry/v1/telemetry.proto`).
//! - [`failure_table`]: the failure-location table file.
//! - [`events`]: the testbed's trip event log (`events.jsonl`), one type for its writer and its readers.
//! - [`handover`]: handover detection and outcome labelling from serving
//!   cells, registration and link state (sans-IO).
//! - [`gpsd`]: gpsd's JSON protocol, parsed into position fixes (sans-IO).
//! - [`mmcli`]: ModemManager's `mmcli -J` outputs, parsed into cell
//!   observations (sans-IO).
//! - [`spool`]: the relay-agent's durable telemetry spool.
//! - [`kafka`]: what the proxy puts into Kafka (topics, keys, headers,
//!   producer settings) and how it reads the table topic, as pure data.
//! - [`testbed_cell_id`]: how the testbed's per-carrier cell indices map to
//!   the cell IDs the data plane and the failure-location tables use.

pub mod events;
pub mod failure_table;
pub mod gpsd;
pub mod handover;
pub mod kafka;
pub mod mmcli;
pub mod route_match;
pub mod spool;

/// The cell ID the data plane uses for cell `cell` of carrier `carrier` in
/// a testbed trip (`polycorn-tracegen`'s event log numbers cells per
/// carrier from 0). Real cell IDs (E-UTRAN cell identities) are 28-bit and
/// never 0; this keeps those properties distinct per carrier and never 0,
/// because 0 means "cell unknown" everywhere.
pub fn testbed_cell_id(carrier: u32, cell: u32) -> u64 {
    (u64::from(carrier) + 1) << 32 | u64::from(cell)
}

/// A property test's number of cases: `ci`, times `POLYCORN_TEST_DEPTH` when
/// set (`make test-deep`; polycorn_core::testing::cases says more).
#[cfg(test)]
fn cases(ci: u32) -> u32 {
    std::env::var("POLYCORN_TEST_DEPTH")
        .map_or(ci, |v| ci * v.parse::<std::num::NonZeroU32>().expect("POLYCORN_TEST_DEPTH: a positive integer").get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testbed_cell_ids_are_distinct_per_carrier_and_never_zero() {
        assert_ne!(testbed_cell_id(0, 0), 0);
        assert_ne!(testbed_cell_id(0, 5), testbed_cell_id(1, 5));
        assert_eq!(testbed_cell_id(1, 7), (2u64 << 32) | 7);
    }
}

/// The telemetry record schema, version 1 (`schema/telemetry/v1/telemetry.proto`).
pub mod v1 {
    #![allow(clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/polycorn.telemetry.v1.rs"));
}
