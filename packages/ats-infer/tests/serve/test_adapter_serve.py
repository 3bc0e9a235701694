"""`ats-infer serve --engine torch --adapter DIR`: the server answers with the adapted model, whose
greedy completion equals the merged model's (decoded in process by the torch engine)."""

import openai
import torch
from ats_infer.engine import load_engine
from ats_model import load_pretrained, save_pretrained
from ats_model.adapters import LoRAConfig, apply_lora, merge_lora, save_adapter

from .conftest import API_KEY, start_server

PROMPT = "def read_file(path):\n    "


def test_served_adapter_decodes_as_the_merged_model(chat_model_dir, tmp_path) -> None:
    model = load_pretrained(chat_model_dir)
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("wq", "wv", "wo", "w1", "w2"))
    apply_lora(model, lora)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    save_adapter(model, tmp_path / "adapter", "lora", lora)
    merged = save_pretrained(
        merge_lora(model), tmp_path / "merged", tokenizer_json=chat_model_dir / "tokenizer.json"
    )
    expected = "".join(
        load_engine(merged, "torch").generate(PROMPT, max_new_tokens=12, temperature=0.0)
    )
    base = "".join(
        load_engine(chat_model_dir, "torch").generate(PROMPT, max_new_tokens=12, temperature=0.0)
    )
    assert expected != base  # the adapter changes what the model says
    srv = start_server(chat_model_dir, tmp_path / "server.log", tmp_path, "--engine", "torch",
                       "--adapter", str(tmp_path / "adapter"), "--slots", "1")  # fmt: skip
    try:
        api = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
        out = api.completions.create(model=srv.model, prompt=PROMPT, max_tokens=12, temperature=0)
        assert out.choices[0].text == expected
    finally:
        assert srv.stop() == 0
