"""Chat template for SFT: ChatML turns -> (ids, loss_mask) with the mask on assistant tokens only.

Format (ChatML, as used by OpenAI and Qwen), one block per message:

    <|im_start|>{role}\\n{content}<|im_end|>\\n

`<|im_start|>` and `<|im_end|>` are special tokens; the role line and the content are encoded as
ordinary text, separately, so that message content can never inject a special token. The loss mask
is 1 on each assistant message's content tokens and on its closing `<|im_end|>` (the model must learn
to stop), 0 everywhere else (headers, system and user turns, separators).
"""

from collections.abc import Callable, Mapping, Sequence

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_SPECIAL_TOKENS = ("<|endoftext|>", IM_START, IM_END)
ROLES = ("system", "user", "assistant")


def apply_chat_template(
    messages: Sequence[Mapping[str, str]],
    special_tokens: Mapping[str, int],
    encode_ordinary: Callable[[str], list[int]],
    add_generation_prompt: bool = False,
) -> tuple[list[int], list[int]]:
    missing = [t for t in (IM_START, IM_END) if t not in special_tokens]
    if missing:
        raise ValueError(
            f"the chat template needs the special tokens {missing}; train the tokenizer with "
            f"special_tokens={CHAT_SPECIAL_TOKENS}"
        )
    start, end = special_tokens[IM_START], special_tokens[IM_END]
    newline = encode_ordinary("\n")
    ids: list[int] = []
    mask: list[int] = []

    def emit(part: list[int], in_loss: bool) -> None:
        ids.extend(part)
        mask.extend([int(in_loss)] * len(part))

    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise ValueError(f"messages[{i}] must be a mapping with exactly 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise ValueError(f"messages[{i}]['role'] is {role!r}; expected one of {ROLES}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]['content'] must be str, got {type(content).__name__}")
        is_assistant = role == "assistant"
        emit([start], False)
        emit(encode_ordinary(role + "\n"), False)
        emit(encode_ordinary(content), is_assistant)
        emit([end], is_assistant)
        emit(newline, False)
    if add_generation_prompt:
        emit([start], False)
        emit(encode_ordinary("assistant\n"), False)
    return ids, mask
