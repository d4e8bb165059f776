"""Run an emitted kernel.cu on the CPU: the very text NVRTC compiles, compiled by the host g++
against an emulation layer (codegen/emu/include): threads as cooperative fibers with the real
semantics of barriers, mbarriers, warp / warpgroup collectives and asynchronous copies."""
from .compile import EmuCompileError
from .launch import SCHEDULES, EmuError, EmuModule, compile_emulated
from .run import VariantUnavailable, from_storage, run_printed, to_storage

__all__ = ["EmuCompileError", "EmuError", "EmuModule", "SCHEDULES", "VariantUnavailable", "compile_emulated",
           "from_storage", "run_printed", "to_storage"]
