#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() -> std::process::ExitCode {
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::new_heap();
    // Before any thread or listener: the listeners' caps are sized from the limit.
    fleetroll::runtime::raise_descriptor_limit();
    // Installed (or linked) as `kubectl-fleetroll`, the binary is the kubectl plugin.
    let invoked_as = std::env::args_os().next().map(std::path::PathBuf::from);
    let plugin = invoked_as
        .as_ref()
        .and_then(|p| p.file_name())
        .is_some_and(|name| name.to_string_lossy().starts_with("kubectl-fleetroll"));
    if plugin { fleetroll::plugin::run() } else { fleetroll::runtime::cli::run() }
}
