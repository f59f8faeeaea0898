"""`grpo-recipes doctor`: the default config passes on this machine, and each check fails with its fix on a faked
condition (a version outside the pins, GPUs against the Accelerate config, a vLLM server that is down or lacks the
weight-sync extension, a machine too small for the estimate, a re-tokenising chat template, an unwritable folder,
a full disk, a missing sandbox). Only tokenizers and config.json files are read: no weights load."""

from __future__ import annotations

import errno
import http.server
import json
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import REPO
from transformers import LlamaConfig

from grpo_recipes import cli
from grpo_recipes.cli import doctor
from grpo_recipes.config.resolve import resolve
from grpo_recipes.sandbox import Isolation
from grpo_recipes.state.models import DEFAULT_MODEL
from grpo_recipes.tools.registry import available, build_tools
from grpo_recipes.vllm.support import WORKER_EXTENSION_ARGS

CONFIGS = REPO / "recipes" / "configs"
ACCELERATE = REPO / "accelerate_configs"
# SmolLM2-135M-Instruct's shape (its config.json), for estimates without the model on disk.
SMOLLM2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)


def parsed(name: str, *flags: str):
    config = resolve(["--config", str(CONFIGS / name), *flags])
    return config.recipe, config.training, config.model


def test_the_default_config_passes_on_this_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # output_dir is relative to where a run starts: a fresh one here
    monkeypatch.setattr(doctor, "default_config_file", str(tmp_path / "none.yaml"))  # not the user's own
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] for line in out.splitlines()[1:] if line and not line.startswith(" ")}
    assert {"config", "versions", "torch", "accelerate", "vLLM", "model", "chat", "memory", "output_dir",
            "trackio_dir", "sandbox"} <= rows, out
    assert "FAIL" not in out and "math_cpu.yaml: checked as at start-up" in out and "no check failed" in out
    # The same run on a machine with 2 GB of RAM and 1 GB of disk: it would fail, and the exit code says so.
    monkeypatch.setattr(doctor, "machine_memory", lambda on_gpu: (int(1e9), int(2e9), "RAM"))
    monkeypatch.setattr(doctor, "disk_free", lambda path: int(1e9))
    assert cli.main(["doctor"]) == 1
    failed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if "  FAIL  " in line}
    assert failed == {"memory", "output_dir"}, failed


def test_a_config_error_reads_as_at_start_up_and_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["doctor", "--recipe", "math", "--", "--max_step", "3"]) == 1
    out = capsys.readouterr().out
    assert "config" in out and "max_step: unknown field in the command line; did you mean `max_steps`?" in out
    assert "versions" in out and "torch build" in out  # the machine's own checks still run


# ------------------------------------------------------------------------------------------------ versions


def test_a_version_outside_the_pins_fails_with_the_install_command(monkeypatch):
    assert doctor.versions_row(use_vllm=False, trackio=True, on_cpu=True).status == "ok"
    real = doctor.metadata.version
    monkeypatch.setattr(doctor.metadata, "version", lambda name: "1.15.0" if name == "trl" else real(name))
    row = doctor.versions_row(use_vllm=False, trackio=True, on_cpu=True)
    assert row.status == "FAIL" and "trl 1.15.0 is not <1.17,>=1.16" in row.detail
    assert row.fix == "pip install 'trl<1.17,>=1.16'"


def test_vllm_is_checked_only_when_the_config_uses_it(monkeypatch):
    real = doctor.metadata.version
    monkeypatch.setattr(doctor.metadata, "version", lambda name: "0.32.0" if name == "vllm" else real(name))
    monkeypatch.setattr(doctor, "vllm_install_problems", lambda on_cpu: [])  # vLLM counts as installed here
    assert doctor.versions_row(use_vllm=False, trackio=True, on_cpu=True).status == "ok"
    row = doctor.versions_row(use_vllm=True, trackio=True, on_cpu=True)
    assert row.status == "FAIL" and "vllm 0.32.0 is not <=0.31,>=0.22" in row.detail


def test_torch_build_against_the_gpus():
    cpu_on_gpus = doctor.torch_row(present=2, visible=0, cuda_build=False, cpu_wanted=False)
    assert cpu_on_gpus.status == "FAIL" and "CPU build" in cpu_on_gpus.detail and "whl/cu" in cpu_on_gpus.fix
    assert doctor.torch_row(present=2, visible=0, cuda_build=False, cpu_wanted=True).status == "ok"
    cuda_alone = doctor.torch_row(present=0, visible=0, cuda_build=True, cpu_wanted=False)
    assert cuda_alone.status == "warn" and "whl/cpu" in cuda_alone.fix
    assert doctor.torch_row(present=2, visible=2, cuda_build=True, cpu_wanted=False).status == "ok"


# ------------------------------------------------------------------------------------------------ accelerate


def test_gpu_count_against_the_accelerate_config():
    multi = {"distributed_type": "MULTI_GPU", "num_processes": 4, "use_cpu": False}
    short = doctor.accelerate_row(multi, "multi.yaml", gpus=2)
    assert short.status == "FAIL" and "only 2 GPU(s)" in short.detail and "--num_processes 2" in short.fix
    assert doctor.accelerate_row(multi, "multi.yaml", gpus=4).status == "ok"
    single = doctor.read_yaml(ACCELERATE / "single_gpu.yaml")
    none = doctor.accelerate_row(single, "single_gpu.yaml", gpus=0)
    assert none.status == "FAIL" and "--accelerate-config cpu " in none.fix
    idle = doctor.accelerate_row(single, "single_gpu.yaml", gpus=2)
    assert idle.status == "warn" and "1 GPU(s) idle" in idle.detail
    two = doctor.accelerate_row({**single, "num_processes": 2}, "single_gpu.yaml", gpus=2)
    assert two.status == "FAIL" and "distributed_type NO runs one process" in two.detail
    assert doctor.accelerate_row(doctor.read_yaml(ACCELERATE / "cpu.yaml"), "cpu.yaml", gpus=0).status == "ok"


def test_the_batch_geometry_at_the_accelerate_process_count():
    flags = ["--generation_batch_size", "16", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"]
    config = resolve(["--config", str(CONFIGS / "math_cpu.yaml"), *flags])  # 16 fits 1 process (and 2), not 3
    training, explicit = config.training, config.explicit
    ddp = {"distributed_type": "MULTI_GPU", "num_processes": 3, "use_cpu": True}
    row = doctor.accelerate_row(ddp, "ddp.yaml", 0, training, explicit)
    assert row.status == "FAIL" and "generation_batch_size: 16 is not a multiple" in row.detail
    assert doctor.accelerate_row({**ddp, "num_processes": 2}, "ddp.yaml", 0, training, explicit).status == "ok"


def test_the_model_is_found_without_weights_or_named_when_missing(tmp_path):
    found = doctor.find_model(DEFAULT_MODEL, str(tmp_path))  # a model cache with nothing converted yet
    folder = Path(found["pretrained_model_name_or_path"])
    assert (folder / "config.json").is_file() or (folder / found["gguf_file"]).is_file()
    assert not any(tmp_path.iterdir())  # nothing converted or downloaded
    with pytest.raises(doctor.ConfigError, match="model_name_or_path: cannot find 'nobody/no-such-model'"):
        doctor.find_model("nobody/no-such-model")


# ------------------------------------------------------------------------------------------------ vLLM server


@contextmanager
def fake_server(extension: bool = True, weight_transfer: dict | None = None):
    """A stand-in vLLM server: /health, /server_info (dev mode), and /collective_rpc, which answers 500 for the
    re-pack call as a server started without this project's worker extension does."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.startswith("/server_info"):
                return self.answer(200, {"vllm_config": {"weight_transfer_config": weight_transfer}})
            self.answer(200 if self.path == "/health" else 404, {})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.answer(200 if extension else 500, {"results": [True]} if extension else {
                "error": "NotImplementedError: Method 'repack_tied_lm_head' is not implemented."})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def server_mode(port: int):
    return SimpleNamespace(use_vllm=True, vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=port,
                           vllm_server_base_url=None)


def test_a_vllm_server_that_does_not_answer_fails():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket is closed
    row = doctor.vllm_server_row(server_mode(closed), on_cpu=True, timeout_s=0.5)
    assert row.status == "FAIL" and f"no vLLM server answers at http://127.0.0.1:{closed}/health" in row.detail
    assert "trl vllm-serve" in row.fix and " ".join(WORKER_EXTENSION_ARGS) in row.fix


def test_a_vllm_server_without_the_weight_sync_extension_fails():
    with fake_server(extension=False) as port:
        row = doctor.vllm_server_row(server_mode(port), on_cpu=True)
    assert row.status == "FAIL" and "no weight-sync extension" in row.detail
    assert " ".join(WORKER_EXTENSION_ARGS) in row.fix
    with fake_server(extension=True) as port:
        assert doctor.vllm_server_row(server_mode(port), on_cpu=True).status == "ok"


def test_a_gpu_trainer_needs_the_servers_weight_transfer_engine():
    with fake_server(weight_transfer=None) as port:
        row = doctor.vllm_server_row(server_mode(port), on_cpu=False)
    assert row.status == "FAIL" and "--weight-transfer-config" in row.fix
    with fake_server(weight_transfer={"backend": "nccl"}) as port:
        assert doctor.vllm_server_row(server_mode(port), on_cpu=False).status == "ok"


def test_no_server_is_tried_outside_server_mode():
    _, training, _ = parsed("math_cpu.yaml")
    assert doctor.vllm_server_row(training, on_cpu=True).detail == "not used"


# ------------------------------------------------------------------------------------------------ memory


def math_estimate(*flags: str):
    recipe, training, model_args = parsed("math_cpu.yaml", *flags)
    params = doctor.count_parameters(SMOLLM2)
    # The math default's longest prompt is 53 tokens with SmolLM2's template (the doctor's own count).
    return doctor.estimate_memory(SMOLLM2, params, {"grpo": training}, model_args, 53, 48, on_gpu=False)


def test_the_memory_estimate_of_the_default_is_near_its_measured_peak():
    """bench/results/stages_default.md: 3.55 GB peak RSS for the whole default run."""
    peak, parts = math_estimate()
    assert 3.0e9 < peak < 4.0e9, parts
    assert math_estimate("--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1")[0] > peak + 2e9
    assert math_estimate("--use_peft", "true")[0] < peak - 1e9  # no gradients or AdamW moments for the base


def test_an_estimate_over_the_machines_memory_fails(monkeypatch):
    peak, parts = math_estimate()
    small = doctor.memory_row(peak, parts, (int(1e9), int(2e9), "RAM"))
    assert small.status == "FAIL" and "RAM 1.0 GB free of 2.0" in small.detail
    assert "per_device_train_batch_size" in small.fix and "activation_checkpointing" in small.fix
    busy = doctor.memory_row(peak, parts, (int(1e9), int(64e9), "RAM"))
    assert busy.status == "warn" and "more than is free now" in busy.detail
    assert doctor.memory_row(peak, parts, (int(32e9), int(64e9), "RAM")).status == "ok"


# ------------------------------------------------------------------------------------------------ chat template


@pytest.fixture
def calculator_specs():
    from transformers.utils import get_json_schema

    return [get_json_schema(f) for f in build_tools(["calculator"], available())]


PROMPT = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "Calculate 2 + 3."}]


def test_the_tool_template_renders_parses_and_keeps_the_earlier_tokens(tool_tokenizer, calculator_specs):
    row = doctor.template_row(tool_tokenizer, PROMPT, calculator_specs)
    assert row.status == "ok" and "'calculator' call renders and parses back" in row.detail


def test_a_template_that_re_renders_earlier_turns_fails(tool_tokenizer, calculator_specs):
    """This template writes an assistant turn's tool calls only while it is the last message: once the result is
    appended, the call the model sampled disappears from the tokens that would be trained on."""
    loop = "{%- for call in message['tool_calls'] or [] -%}"
    assert loop in tool_tokenizer.chat_template
    tool_tokenizer.chat_template = tool_tokenizer.chat_template.replace(
        loop, "{%- for call in (message['tool_calls'] if loop.last else []) or [] -%}")
    row = doctor.template_row(tool_tokenizer, PROMPT, calculator_specs)
    assert row.status == "FAIL" and "appending a tool result re-renders the earlier turns" in row.detail
    assert "chatml_tools" in row.fix


def test_a_template_whose_calls_do_not_parse_back_fails(tool_tokenizer, calculator_specs):
    tool_tokenizer.chat_template = tool_tokenizer.chat_template.replace("<tool_call>\\n", "<call>\\n")
    row = doctor.template_row(tool_tokenizer, PROMPT, calculator_specs)
    assert row.status == "FAIL" and "does not parse back" in row.detail


# ------------------------------------------------------------------------------------------------ folders, disk


def test_an_output_folder_that_cannot_be_written_fails(tmp_path, monkeypatch):
    assert doctor.folder_row("output_dir", tmp_path / "new" / "run", 0).status == "ok"
    (tmp_path / "file").write_text("")
    under_file = doctor.folder_row("output_dir", tmp_path / "file" / "run", 0)
    assert under_file.status == "FAIL" and "is a file, not a folder" in under_file.detail
    assert "another output_dir" in under_file.fix

    def read_only(**_):  # as a read-only mount answers, even to root (mode bits do not stop root)
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(doctor.tempfile, "mkstemp", read_only)
    row = doctor.folder_row("output_dir", tmp_path / "run", 0)
    assert row.status == "FAIL" and "cannot write in" in row.detail and "Read-only file system" in row.detail


def test_low_disk_fails(tmp_path, monkeypatch):
    _, training, model_args = parsed("math_cpu.yaml")
    need = doctor.output_need(134_515_008, 4, {"grpo": training}, model_args)
    # Saves at steps 5 and 6 (save_steps 5, max_steps 6), both kept (save_total_limit 2): 2 x (weights + AdamW's
    # two moments), and the final model.
    assert need == pytest.approx(134_515_008 * 4 * (2 * 3 + 1))
    assert doctor.folder_row("output_dir", tmp_path, need).status == "ok"
    monkeypatch.setattr(doctor, "disk_free", lambda path: 10**9)
    row = doctor.folder_row("output_dir", tmp_path, need)
    assert row.status == "FAIL" and "1.0 GB free, the run writes ~3.8 GB" in row.detail and "disk space" in row.fix


# ------------------------------------------------------------------------------------------------ sandbox


def test_sandbox_protections_are_reported_and_required_only_where_used():
    assert not doctor.uses_sandbox(parsed("math_cpu.yaml")[0])
    assert doctor.uses_sandbox(parsed("code_cpu.yaml")[0])
    gone = Isolation("unavailable", problem="the probe job failed")
    assert doctor.sandbox_row(gone, needed=True).status == "FAIL"
    assert doctor.sandbox_row(gone, needed=False).status == "warn"
    partial = Isolation("none", walls=(("namespaces", "isolation mode none"), ("seccomp", "")))
    row = doctor.sandbox_row(partial, needed=True)
    assert row.status == "warn" and "MISSING: namespaces" in row.detail and "GRPO_SANDBOX_REQUIRE" in row.fix
