//! `polycorn-tracegen`: generate synthetic HSR link traces (hsr-facts §15) and validate them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use polycorn_tracegen::{generate, validate::validate, write, Preset, TripConfig};

#[derive(Parser)]
#[command(name = "polycorn-tracegen", version, about = "Synthetic HSR multi-carrier link traces (hsr-facts §15)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate one trip into a directory.
    Generate {
        /// Preset: pc-gateway-300, m19-phone-300, m19-phone-350 or static.
        #[arg(long, default_value = "pc-gateway-300")]
        preset: String,
        /// Seed of the route-fixed randomness (cell layout, per-cell failure propensity).
        #[arg(long, default_value_t = 1)]
        route_seed: u64,
        /// Seed of the per-trip randomness.
        #[arg(long, default_value_t = 1)]
        trip_seed: u64,
        /// Trip length in seconds.
        #[arg(long, default_value_t = 600)]
        duration_s: u64,
        /// Number of carriers (even-numbered use carrier A's parameters, odd ones B's).
        #[arg(long, default_value_t = 2)]
        carriers: usize,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Compare generated trips with published numbers (a subset of hsr-facts §15.8).
    Validate {
        /// Trip directories.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Generate { preset, route_seed, trip_seed, duration_s, carriers, out } => {
            let Some(preset) = Preset::by_name(&preset) else {
                eprintln!("unknown preset {preset:?}; known: {}", Preset::NAMES.join(", "));
                return ExitCode::from(2);
            };
            if duration_s == 0 || carriers == 0 {
                eprintln!("--duration-s and --carriers must be positive");
                return ExitCode::from(2);
            }
            let cfg = TripConfig { preset, route_seed, trip_seed, duration_s, carriers };
            write(&cfg, &generate(&cfg), &out)
        }
        Cmd::Validate { dirs } => validate(&dirs).map(|r| print!("{r}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polycorn-tracegen: {e}");
            ExitCode::FAILURE
        }
    }
}
