"""`agentctl doctor`: what a device lacks for its configuration (agent.doctor.checks)."""

from agent.doctor.checks import Finding, Report, State, diagnose
from agent.doctor.host import Host, RealHost
from agent.doctor.unit import Unit, read_unit

__all__ = ["Finding", "Host", "RealHost", "Report", "State", "Unit", "diagnose", "read_unit"]
