//! `polycorn-pki`: create the Polycorn development CA and issue train and
//! proxy certificates. See the library documentation for the identity model.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use polycorn_pki::{
    generate_ca, issue_proxy, issue_train, load_ca, write_ca, write_dev_bundle, write_issued, DEFAULT_CA_DAYS,
    DEFAULT_CA_NAME, DEFAULT_LEAF_DAYS,
};

/// Polycorn development PKI.
///
/// One CA signs one certificate per train (CN = train id, DNS SAN
/// `<train-id>.trains.polycorn`, clientAuth) and the proxy server
/// certificates (serverAuth). All keys are ECDSA P-256 and are written with
/// mode 0600.
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
    /// Write a development bundle (CA, proxy and train certificates) into OUT.
    ///
    /// Writes OUT/ca.crt and OUT/ca.key (reused if OUT already has a CA, so
    /// earlier certificates stay valid), OUT/proxy.crt and OUT/proxy.key (SANs
    /// proxy.polycorn, localhost, 127.0.0.1 and ::1) and OUT/<ID>.crt and
    /// OUT/<ID>.key for every --train. Proxy and train certificates are
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
        Command::Dev { out, trains } => {
            let bundle = write_dev_bundle(&out, &trains).context("dev failed")?;
            let ca_state = if bundle.reused_ca { "reused" } else { "generated" };
            println!("CA ({ca_state}): {}", bundle.ca_cert.display());
            println!("proxy: {} {}", bundle.proxy_cert.display(), bundle.proxy_key.display());
            for (train, (cert, key)) in &bundle.trains {
                println!("train {train}: {} {}", cert.display(), key.display());
            }
        }
    }
    Ok(())
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
