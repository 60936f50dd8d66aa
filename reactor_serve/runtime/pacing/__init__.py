"""Pacing: the output buffer, the splitter of emitted blocks into frames, the emission clock, the production-rate estimate, frame validation and audio resampling."""
