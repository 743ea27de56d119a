//! `polycorn-pki`: create the Polycorn development CA and issue train and
//! proxy certificates. See the library documentation for the identity model.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use polycorn_pki::{
    generate_ca, issue_proxy, issue_train, load_ca, resign_crl, revoke, serial_issued_by, write_ca, write_dev_bundle,
    write_issued, write_table_key, CrlReport, RevokeReason, Serial, DEFAULT_CA_DAYS, DEFAULT_CA_NAME, DEFAULT_CRL_DAYS,
    DEFAULT_LEAF_DAYS,
};

/// Polycorn development PKI.
///
/// One CA signs one certificate per train (CN = train id, DNS SAN
/// `<train-id>.trains.polycorn`, clientAuth) and the proxy server
/// certificates (serverAuth). All keys are ECDSA P-256 and are written with
/// mode 0600. Certificates are revoked with `revoke`, which keeps the list in
/// the CA directory (revoked.json) and writes the signed CRL the proxy loads
/// (ca.crl, `polycorn-proxy --crl`).
#[derive(Debug, Parser)]
#[command(name = "polycorn-pki", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a new CA: writes OUT/ca.crt and OUT/ca.key.
    InitCa {
        /// Directory to write ca.crt and ca.key into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Common name of the CA certificate.
        #[arg(long, value_name = "NAME", default_value = DEFAULT_CA_NAME)]
        name: String,
        /// Validity of the CA certificate, in days.
        #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_CA_DAYS)]
        days: u32,
        /// Replace an existing ca.crt / ca.key (invalidates every certificate
        /// issued by the old CA).
        #[arg(long)]
        force: bool,
    },
    /// Issue the certificate of one train: writes OUT/<ID>.crt and OUT/<ID>.key.
    IssueTrain {
        /// Directory holding the CA's ca.crt and ca.key.
        #[arg(long, value_name = "DIR")]
        ca_dir: PathBuf,
        /// Train id, one lowercase DNS label such as `train-0042`; becomes the
        /// CN and the SAN `<ID>.trains.polycorn`.
        #[arg(long, value_name = "ID")]
        train_id: String,
        /// Directory to write <ID>.crt and <ID>.key into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Validity of the certificate, in days.
        #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
        /// Replace existing <ID>.crt / <ID>.key.
        #[arg(long)]
        force: bool,
    },
    /// Issue a proxy server certificate: writes OUT/<NAME>.crt and OUT/<NAME>.key.
    IssueProxy {
        /// Directory holding the CA's ca.crt and ca.key.
        #[arg(long, value_name = "DIR")]
        ca_dir: PathBuf,
        /// Proxy name: the certificate CN and the file stem (A-Z, a-z, 0-9,
        /// '-', '_', '.').
        #[arg(long, value_name = "NAME")]
        name: String,
        /// Subject alternative names: DNS names (e.g. proxy.polycorn,
        /// localhost) and/or IP addresses (e.g. 127.0.0.1, ::1). Repeat the
        /// flag or give several values; at least one is required, and the
        /// relay-agent must dial one of them.
        #[arg(long = "san", value_name = "DNS_OR_IP", required = true, num_args = 1..)]
        sans: Vec<String>,
        /// Directory to write <NAME>.crt and <NAME>.key into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Validity of the certificate, in days.
        #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
        /// Replace existing <NAME>.crt / <NAME>.key.
        #[arg(long)]
        force: bool,
    },
    /// Revoke a certificate: add its serial to DIR/revoked.json and write a
    /// freshly signed DIR/ca.crl.
    ///
    /// Give the certificate file (it must have been issued by this CA) or its
    /// serial (hex, as `openssl x509 -noout -serial` prints it). The new CRL
    /// has the next CRL number and a nextUpdate --days ahead. Copy ca.crl to
    /// every proxy (`polycorn-proxy --crl`; it reloads the file when it
    /// changes): from then on a handshake with the revoked certificate fails.
    /// Re-issuing a train's certificate does not revoke the old one: revoke
    /// it (reason superseded) once the train has the new one.
    Revoke {
        /// Directory holding the CA's ca.crt and ca.key; revoked.json and
        /// ca.crl are kept there.
        #[arg(long, value_name = "DIR")]
        ca_dir: PathBuf,
        /// The certificate to revoke (PEM, e.g. train-0042.crt).
        #[arg(long, value_name = "FILE", required_unless_present = "serial", conflicts_with = "serial")]
        cert: Option<PathBuf>,
        /// The serial number of the certificate to revoke (hex).
        #[arg(long, value_name = "HEX")]
        serial: Option<String>,
        /// Why it is revoked.
        #[arg(long, value_enum, default_value = "unspecified")]
        reason: RevokeReason,
        /// Days until the CRL's nextUpdate: re-sign (`crl`) before then.
        #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_CRL_DAYS)]
        days: u32,
    },
    /// Re-sign the CA's CRL: write DIR/ca.crl from DIR/revoked.json (an empty
    /// CRL if nothing was revoked yet) with the next CRL number.
    ///
    /// A CRL carries a nextUpdate (--days ahead); the proxy warns once it has
    /// passed but keeps applying it. Re-sign at least every --days / 2 (e.g.
    /// weekly with the default 30 days) and copy ca.crl to the proxies.
    Crl {
        /// Directory holding the CA's ca.crt and ca.key.
        #[arg(long, value_name = "DIR")]
        ca_dir: PathBuf,
        /// Days until the CRL's nextUpdate.
        #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_CRL_DAYS)]
        days: u32,
    },
    /// Generate the failure-table signing key pair: OUT/table-signing.key
    /// (Ed25519, PKCS#8 PEM, mode 0600) and OUT/table-signing.pub (its public
    /// key, SubjectPublicKeyInfo PEM).
    ///
    /// The trainer signs every table it publishes with the private key
    /// (`polycorn-trainer run --table-signing-key`); relays and proxies
    /// verify with the public key (`--failure-table-verify-key`). To rotate,
    /// make a new pair elsewhere, append its .pub to the verify-key file of
    /// every relay and proxy, then switch the trainer (docs/operations.md).
    TableKey {
        /// Directory to write the key pair into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace an existing key pair (relays and proxies that verify with
        /// the old public key then refuse the new tables).
        #[arg(long)]
        force: bool,
    },
    /// Write a development bundle (CA, proxy and train certificates, the
    /// failure-table signing key) into OUT.
    ///
    /// Writes OUT/ca.crt and OUT/ca.key (reused if OUT already has a CA, so
    /// earlier certificates stay valid), OUT/proxy.crt and OUT/proxy.key (SANs
    /// proxy.polycorn, localhost, 127.0.0.1 and ::1) and OUT/<ID>.crt and
    /// OUT/<ID>.key for every --train, and OUT/table-signing.key and .pub
    /// (kept if they exist, like the CA). Proxy and train certificates are
    /// re-issued on every run.
    Dev {
        /// Bundle directory (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Train id to issue a certificate for (e.g. train-0042); repeat the
        /// flag or give several values for several trains.
        #[arg(long = "train", value_name = "ID", required = true, num_args = 1..)]
        trains: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::InitCa { out, name, days, force } => {
            let ca = generate_ca(&name, days).context("init-ca failed")?;
            let paths = write_ca(&out, &ca, force).context("init-ca failed")?;
            println!("wrote {}", paths.cert.display());
            println!("wrote {} (mode 0600)", paths.key.display());
        }
        Command::IssueTrain { ca_dir, train_id, out, days, force } => {
            let ca = load_ca(&ca_dir).context("issue-train failed")?;
            let issued = issue_train(&ca, &train_id, days).context("issue-train failed")?;
            let paths = write_issued(&out, &train_id, &issued, force).context("issue-train failed")?;
            println!("wrote {}", paths.cert.display());
            println!("wrote {} (mode 0600)", paths.key.display());
        }
        Command::IssueProxy { ca_dir, name, sans, out, days, force } => {
            let ca = load_ca(&ca_dir).context("issue-proxy failed")?;
            let issued = issue_proxy(&ca, &name, &sans, days).context("issue-proxy failed")?;
            let paths = write_issued(&out, &name, &issued, force).context("issue-proxy failed")?;
            println!("wrote {}", paths.cert.display());
            println!("wrote {} (mode 0600)", paths.key.display());
        }
        Command::Revoke { ca_dir, cert, serial, reason, days } => {
            let (serial, name) = match (cert, serial) {
                (Some(cert), _) => {
                    let ca = load_ca(&ca_dir).context("revoke failed")?;
                    serial_issued_by(&ca, &cert).context("revoke failed")?
                }
                (None, Some(hex)) => (Serial::from_hex(&hex).context("revoke failed")?, None),
                (None, None) => anyhow::bail!("revoke needs --cert FILE or --serial HEX"),
            };
            let report = revoke(&ca_dir, &serial, name.clone(), reason, days).context("revoke failed")?;
            let what = name.map_or_else(String::new, |n| format!(" ({n})"));
            if report.newly_revoked {
                println!("revoked serial {serial}{what}");
            } else {
                println!("serial {serial}{what} was already revoked");
            }
            print_crl(&report);
        }
        Command::Crl { ca_dir, days } => {
            let report = resign_crl(&ca_dir, days).context("crl failed")?;
            print_crl(&report);
        }
        Command::TableKey { out, force } => {
            let paths = write_table_key(&out, force).context("table-key failed")?;
            println!("wrote {} (mode 0600): the trainer's --table-signing-key", paths.private_key.display());
            println!("wrote {}: relays' and proxies' --failure-table-verify-key", paths.public_key.display());
        }
        Command::Dev { out, trains } => {
            let bundle = write_dev_bundle(&out, &trains).context("dev failed")?;
            let ca_state = if bundle.reused_ca { "reused" } else { "generated" };
            println!("CA ({ca_state}): {}", bundle.ca_cert.display());
            println!("proxy: {} {}", bundle.proxy_cert.display(), bundle.proxy_key.display());
            for (train, (cert, key)) in &bundle.trains {
                println!("train {train}: {} {}", cert.display(), key.display());
            }
            let key_state = if bundle.reused_table_key { "reused" } else { "generated" };
            println!(
                "failure-table signing key ({key_state}): {} {}",
                bundle.table_key.private_key.display(),
                bundle.table_key.public_key.display()
            );
        }
    }
    Ok(())
}

fn print_crl(report: &CrlReport) {
    println!("wrote {}", report.state.display());
    println!(
        "wrote {} (CRL number {}, {} revoked, next update at Unix time {}: re-sign before then)",
        report.crl.display(),
        report.crl_number,
        report.revoked,
        report.next_update
    );
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
