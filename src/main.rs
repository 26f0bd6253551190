fn main() -> std::process::ExitCode {
    fleetroll::cli::run()
}
