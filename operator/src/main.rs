//! `riverbank-operator`: for now, only prints the DataflowJob CRD.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "riverbank-operator",
    version,
    about = "The Riverbank Kubernetes operator (DataflowJob, riverbank.dev/v1alpha1)",
    long_about = "The Riverbank Kubernetes operator (DataflowJob, riverbank.dev/v1alpha1).\n\n\
        This build only prints the CustomResourceDefinition. The controller that reconciles \
        DataflowJobs (creating their coordinator and worker StatefulSets, autoscaling, status) \
        is not implemented yet; it will be the `run` subcommand."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the DataflowJob CustomResourceDefinition as YAML (what crds/dataflowjob.yaml holds).
    Crd,
}

fn main() {
    match Cli::parse().command {
        Command::Crd => print!("{}", riverbank_operator::crd_yaml()),
    }
}
