"""Measurement aids for hetu's benches and tests, installed beside hetu and never imported by it:
namespace hosts with shaped links (netns) and HET's cache protocol replayed offline without
servers (het_replay)."""
