"""A plug-in whose dependency is not installed."""
import attnreplay_plugin as ar  # noqa: F401
import a_package_that_is_not_installed  # noqa: F401
