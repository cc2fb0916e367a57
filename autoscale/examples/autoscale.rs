//! `riverbank autoscale` until the binary mounts it:
//! `cargo run -p riverbank-autoscale --example autoscale -- simulate TRACE… [--options FILE]`.
use clap::Parser;
use riverbank_autoscale::AutoscaleCommand;

#[derive(Parser)]
#[command(name = "autoscale")]
struct Args {
    #[command(subcommand)]
    command: AutoscaleCommand,
}

fn main() {
    match riverbank_autoscale::run(Args::parse().command) {
        Ok(out) => print!("{out}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
