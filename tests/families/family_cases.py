"""Each family's test conversations and the rendering its template must produce, written from the family's
documentation (docs/models.md): segments ``(text, trained)`` whose concatenation is the expected text and whose
trained segments are exactly the characters a reply trains on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                         "parameters": {"type": "object",
                                                        "properties": {"city": {"type": "string"},
                                                                       "days": {"type": "integer"}}}}}
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
TOOL_JSON = json.dumps(TOOL, ensure_ascii=False)
FN_JSON = json.dumps(TOOL["function"], ensure_ascii=False)
CALL_ARGS = json.dumps(CALL["arguments"])


def tool_conversation(reasoning: bool = False) -> dict[str, Any]:
    """system, user, a tool call, its result, the answer (with reasoning for thinking families)."""
    think = (lambda text: {"reasoning_content": text}) if reasoning else (lambda text: {})
    return {"messages": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL], **think("Need the tool.")},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 C.", **think("Tool says 21.")},
    ], "tools": [TOOL]}


def chat_conversation() -> dict[str, Any]:
    return {"messages": [
        {"role": "system", "content": "You are a helpful bot."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye."},
    ]}


Segments = list[tuple[str, bool]]

_QWEN_TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
               "function signatures within <tools></tools> XML tags:\n<tools>\n" + TOOL_JSON + "\n</tools>")
_V4_TOOLS = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing "
    "a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled "
    "(triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls "
    "or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n" + FN_JSON + "\n\nYou MUST strictly follow the above defined tool name and "
    "parameter schemas to invoke tool calls.\n")
_LLAMA_HINT = ("Given the following functions, please respond with a JSON for a function call with its proper "
               "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
               "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n")
_GLM_TOOLS = ("你是一个名为 ChatGLM 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，"
              "你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具\n\n## get_weather\n\n"
              + json.dumps(TOOL["function"], ensure_ascii=False, indent=4)
              + "\n在调用上述函数时，请使用 Json 格式表示调用的参数。")
_QWEN35_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
                "</parameter>\n</function>\n</tool_call>")


@dataclass
class Case:
    """A conversation, the template arguments, and the rendering its family's template must produce."""

    row: dict[str, Any]
    segments: Segments
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)


def cases(key: str) -> list[Case]:
    """The conversations of a family, each with its expected rendering (written from the family's format)."""
    if key in ("qwen3_5", "qwen3_5_moe"):
        system = ("<|im_start|>system\nYou are a weather bot.\n\n" + _QWEN_TOOLS + "\n\nIf you choose to call a "
                  "function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function="
                  "example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
                  "</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
        result = ("\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n")
        thinking = Case(tool_conversation(reasoning=True), [
            (system + "<think>\n", False), ("Need the tool.\n</think>\n\n" + _QWEN35_CALL + "<|im_end|>", True),
            (result + "<think>\n", False), ("Tool says 21.\n</think>\n\nIt is 21 C.<|im_end|>", True), ("\n", False)])
        closed = "<think>\n\n</think>\n\n"
        plain = Case(tool_conversation(), [
            (system + closed, False), (_QWEN35_CALL + "<|im_end|>", True), (result + closed, False),
            ("It is 21 C.<|im_end|>", True), ("\n", False)])
        return [thinking, plain]
    if key == "qwen2_5":
        return [Case(tool_conversation(), [
            ("<|im_start|>system\nYou are a weather bot.\n\n" + _QWEN_TOOLS + "\n\nFor each function call, return a "
             "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
             "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>"
             "user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n", False),
            ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + CALL_ARGS + "}\n</tool_call><|im_end|>",
             True),
            ("\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
             False),
            ("It is 21 C.<|im_end|>", True), ("\n", False)])]
    if key == "deepseek_v4":
        dsml = ("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
                "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">2"
                "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
        thinking = Case(tool_conversation(reasoning=True), [
            ("<｜begin▁of▁sentence｜>You are a weather bot.\n\n" + _V4_TOOLS + "<｜User｜>Weather in Paris?"
             "<｜Assistant｜><think>", False),
            ("Need the tool.</think>" + dsml + "<｜end▁of▁sentence｜>", True),
            ("<｜User｜><tool_result>{\"temp\": 21}</tool_result><｜Assistant｜><think>", False),
            ("Tool says 21.</think>It is 21 C.<｜end▁of▁sentence｜>", True)])
        chat = Case(chat_conversation(), [
            ("<｜begin▁of▁sentence｜>You are a helpful bot.<｜User｜>Hi<｜Assistant｜></think>", False),
            ("Hello!<｜end▁of▁sentence｜>", True), ("<｜User｜>Bye<｜Assistant｜></think>", False),
            ("Goodbye.<｜end▁of▁sentence｜>", True)])
        return [thinking, chat]
    if key == "deepseek_r1":
        return [Case(tool_conversation(reasoning=True), [
            ("<｜begin▁of▁sentence｜>You are a weather bot.<｜User｜>Weather in Paris?<｜Assistant｜><think>\n", False),
            ("Need the tool.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
             "get_weather\n"
             "```json\n" + CALL_ARGS + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>", True),
            ("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{\"temp\": 21}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
             False),
            ("It is 21 C.<｜end▁of▁sentence｜>", True)])]
    if key == "llama3":
        head = "<|start_header_id|>{}<|end_header_id|>\n\n"
        return [Case(tool_conversation(), [
            ("<|begin_of_text|>" + head.format("system") + "Environment: ipython\nCutting Knowledge Date: December "
             "2023\nToday Date: 26 Jul 2024\n\nYou are a weather bot.<|eot_id|>" + head.format("user") + _LLAMA_HINT
             + json.dumps(TOOL, indent=4) + "\n\nWeather in Paris?<|eot_id|>" + head.format("assistant"), False),
            ("{\"name\": \"get_weather\", \"parameters\": " + CALL_ARGS + "}<|eot_id|>", True),
            (head.format("ipython") + "{\"temp\": 21}<|eot_id|>" + head.format("assistant"), False),
            ("It is 21 C.<|eot_id|>", True)])]
    if key == "mistral":
        return [Case(tool_conversation(), [
            ("<s>[AVAILABLE_TOOLS] [" + TOOL_JSON + "][/AVAILABLE_TOOLS][INST] You are a weather bot.\n\n"
             "Weather in Paris?[/INST]", False),
            ("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": " + CALL_ARGS + "}]</s>", True),
            ("[TOOL_RESULTS] {\"content\": \"{\\\"temp\\\": 21}\"}[/TOOL_RESULTS]", False),
            (" It is 21 C.</s>", True)])]
    if key == "yi":
        return [Case(chat_conversation(), [
            ("You are a helpful bot.<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", False),
            ("Hello!<|im_end|>", True), ("\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", False),
            ("Goodbye.<|im_end|>", True), ("\n", False)])]
    if key == "glm4":
        return [Case(tool_conversation(), [
            ("[gMASK]<sop><|system|>\n" + _GLM_TOOLS + "<|system|>\nYou are a weather bot.<|user|>\nWeather in Paris?"
             "<|assistant|>", False),
            ("get_weather\n" + CALL_ARGS + "<|observation|>", True), ("\n{\"temp\": 21}<|assistant|>", False),
            ("\nIt is 21 C.<|endoftext|>", True)], kwargs={"trust_remote_code": True})]
    if key == "internlm2_5":
        return [Case(tool_conversation(), [
            ("<s><|im_start|>system\nYou are a weather bot.<|im_end|>\n<|im_start|>system name=<|plugin|>\n["
             + FN_JSON + "]<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n", False),
            ("<|action_start|><|plugin|>\n{\"name\": \"get_weather\", \"parameters\": " + CALL_ARGS
             + "}<|action_end|><|im_end|>", True),
            ("\n<|im_start|>environment name=<|plugin|>\n{\"temp\": 21}<|im_end|>\n<|im_start|>assistant\n", False),
            ("It is 21 C.<|im_end|>", True), ("\n", False)], kwargs={"trust_remote_code": True})]
    raise KeyError(key)
