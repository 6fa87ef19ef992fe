"""Train twinkle's embedded tokenizer and write the matching tiny model config.

Output: packages/twinkle-core/src/twinkle/assets/tiny-qwen/ with
  tokenizer.json         byte-level BPE (vocab ~3k) trained here with `tokenizers`
  tokenizer_config.json  special tokens + a ChatML chat template (with {% generation %} markers)
  config.json            a Qwen2-style causal LM of a few hundred thousand parameters, vocab = tokenizer size

The training text is what the project ships: the embedded self-cognition rows (run
scripts/make_self_cognition.py first) plus the English/Chinese/code lines composed below, all
written for twinkle. The output is deterministic for a given `tokenizers` version.

Run: ``python scripts/make_tokenizer.py``
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ASSETS = Path(__file__).resolve().parents[1] / "packages/twinkle-core/src/twinkle/assets"
OUT = ASSETS / "tiny-qwen"
VOCAB_SIZE = 3072
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)

# ChatML. The {% generation %} block marks what an assistant turn trains on (its content and <|im_end|>),
# so twinkle's Template (and transformers' return_assistant_tokens_mask) read the spans in one render.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}{{- message['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

EN_SUBJECTS = ["The model", "The dataset", "A tokenizer", "The trainer", "Our team", "The optimizer", "This script",
               "The data loader", "Every rank", "The checkpoint", "A small network", "The learning rate"]
EN_VERBS = ["reads", "writes", "splits", "shuffles", "learns from", "saves", "loads", "checks", "counts",
            "encodes", "packs", "repeats"]
EN_OBJECTS = ["the training data", "a batch of rows", "every conversation", "the chat template", "the gradients",
              "a list of tokens", "the loss value", "the next epoch", "the config file", "a long sentence",
              "the user question", "the assistant answer"]
EN_LINES = [
    "Training a language model starts with clean data and a clear goal.",
    "Each row of the dataset holds a conversation between a user and an assistant.",
    "Labels are set to -100 where the model should not learn.",
    "The global batch is split across data parallel ranks without overlap.",
    "Resuming from a checkpoint continues exactly where the run stopped.",
    "Packing puts several short sequences into one row to save padding.",
    "Position ids restart at zero for every packed sequence.",
    "Please write a short poem about the sea and the wind.",
    "The weather today is sunny with a light breeze in the afternoon.",
    "Python is a popular programming language for machine learning.",
    "Translate the following sentence into Chinese, please.",
    "Summarize the article in three sentences.",
    "What is the capital of France? The capital of France is Paris.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "The quick brown fox jumps over the lazy dog.",
    "A good answer is short, correct and polite.",
    "Numbers such as 3.14, 42, 2024 and 1000000 appear in text too.",
    "Thank you for your help! You're welcome, have a nice day.",
]
CODE_LINES = [
    "def train(model, dataloader):", "    for batch in dataloader:", "        loss = model(batch)",
    "        loss.backward()", "import torch", "from twinkle.dataset import Dataset, DatasetMeta",
    "print('hello world')", "x = [i * 2 for i in range(10)]", "if __name__ == '__main__':", "    main()",
    "return {'input_ids': ids, 'labels': labels}", "class Template:", "    def encode(self, row):",
]
ZH_SUBJECTS = ["模型", "数据集", "分词器", "训练器", "我们的团队", "优化器", "这个脚本", "数据加载器", "每个进程",
               "检查点", "小型网络", "学习率"]
ZH_VERBS = ["读取", "写入", "切分", "打乱", "学习", "保存", "加载", "检查", "统计", "编码", "打包", "重复"]
ZH_OBJECTS = ["训练数据", "一批样本", "每一段对话", "对话模板", "梯度", "词元列表", "损失值", "下一个轮次", "配置文件",
              "一个长句子", "用户的问题", "助手的回答"]
ZH_LINES = [
    "训练语言模型首先需要干净的数据和明确的目标。", "数据集的每一行都是用户和助手之间的一段对话。",
    "不需要学习的位置，标签被设置为负一百。", "全局批次被无重叠地分配给各个数据并行进程。",
    "从检查点恢复训练，会从中断的位置继续。", "打包把多条短序列放进一行，以减少填充。",
    "请写一首关于大海和风的小诗。", "今天天气晴朗，下午有微风。", "Python是机器学习中常用的编程语言。",
    "请把下面这句话翻译成英文。", "用三句话总结这篇文章。", "法国的首都是巴黎。", "一二三四五六七八九十。",
    "好的回答应当简洁、正确并且礼貌。", "谢谢你的帮助！不客气，祝你愉快。", "春天来了，花开了，鸟儿在唱歌。",
    "学习新知识需要耐心和坚持。", "我们一起讨论这个问题吧。", "请解释一下什么是梯度下降。",
    "人工智能正在改变我们的生活和工作方式。",
]
# Everyday text on many topics, so the vocabulary is not only about training and identity.
MORE_EN = [
    "Cooking rice takes water, salt, patience and a pot with a tight lid.",
    "We travelled by train through mountains, valleys, forests and small villages.",
    "Scientists measure temperature, pressure and humidity every hour.",
    "The library opens at nine in the morning and closes at six in the evening.",
    "Children learn to read, write, count, draw and sing at school.",
    "A healthy breakfast might include eggs, bread, fruit, yogurt and coffee.",
    "The football team practised passing, shooting and defending all week.",
    "Music connects people across languages, cultures and generations.",
    "An equation balances both sides; algebra teaches us to solve for unknown values.",
    "Her garden is full of roses, tulips, sunflowers, tomatoes and fresh herbs.",
    "The museum displays ancient coins, paintings, sculptures and old maps.",
    "Rain fell heavily during the storm, and the river rose above its banks.",
    "Doctors recommend sleep, exercise, clean water and a balanced diet.",
    "The airport was crowded with travellers carrying suitcases and backpacks.",
    "Engineers design bridges, roads, buildings, engines and electrical circuits.",
    "Mathematics includes geometry, probability, statistics, calculus and logic.",
    "A computer stores information in memory and on disk as bits and bytes.",
    "The market sells vegetables, fish, noodles, spices, tea and flowers.",
    "Astronomers observe planets, stars, comets and distant galaxies with telescopes.",
    "Write clear sentences, check your spelling, and explain every important step.",
    "The company announced a new product, hired engineers and opened an office.",
    "History teaches us about kings, empires, wars, inventions and ordinary families.",
    "Birds migrate south in autumn and return north when spring arrives.",
    "Please remember your password, keep it secret and change it regularly.",
    "The chef sliced onions, peppers and mushrooms before frying them in oil.",
    "Students asked questions about chemistry, biology, physics and geography.",
    "Our neighbour repaired the fence, painted the door and cleaned the windows.",
    "The orchestra performed a symphony with violins, flutes, drums and trumpets.",
    "Software developers review code, fix bugs, write tests and deploy services.",
    "Mountains are cold at night, so bring a jacket, gloves and a warm hat.",
    "Translation requires understanding grammar, vocabulary, tone and context.",
    "The farmer harvested wheat, corn and potatoes before the first frost.",
    "Good teachers listen carefully, encourage curiosity and explain patiently.",
    "Electric cars use batteries, motors and chargers instead of petrol engines.",
    "The journalist interviewed witnesses and published a detailed report.",
    "Friendship grows through honesty, kindness, trust and shared adventures.",
]
MORE_ZH = [
    "煮米饭需要水、盐、耐心和一口盖子严密的锅。", "我们坐火车穿过高山、山谷、森林和小村庄。",
    "科学家每小时测量一次温度、气压和湿度。", "图书馆早上九点开门，晚上六点关门。",
    "孩子们在学校学习阅读、写字、算术、画画和唱歌。", "健康的早餐可以有鸡蛋、面包、水果、酸奶和咖啡。",
    "足球队整周都在练习传球、射门和防守。", "音乐把不同语言、文化和年龄的人连接在一起。",
    "方程两边必须相等，代数教我们求解未知数。", "她的花园里有玫瑰、郁金香、向日葵、番茄和香草。",
    "博物馆展出古代钱币、绘画、雕塑和旧地图。", "暴风雨中大雨倾盆，河水漫过了堤岸。",
    "医生建议充足睡眠、适量运动、干净饮水和均衡饮食。", "机场里挤满了拖着行李箱、背着背包的旅客。",
    "工程师设计桥梁、道路、建筑、发动机和电路。", "数学包括几何、概率、统计、微积分和逻辑。",
    "计算机把信息以比特和字节的形式存放在内存和磁盘中。", "市场上卖蔬菜、鱼、面条、香料、茶叶和鲜花。",
    "天文学家用望远镜观察行星、恒星、彗星和遥远的星系。", "句子要写清楚，注意拼写，并解释每个重要步骤。",
    "公司发布了新产品，招聘了工程师，还开设了新办公室。", "历史告诉我们国王、帝国、战争、发明和普通家庭的故事。",
    "候鸟秋天飞往南方，春天到来时再返回北方。", "请记住你的密码，妥善保密，并定期更换。",
    "厨师先切洋葱、辣椒和蘑菇，再用油煎炒。", "学生们提出了关于化学、生物、物理和地理的问题。",
    "邻居修好了篱笆，粉刷了门，又擦干净了窗户。", "乐团用小提琴、长笛、鼓和小号演奏了一首交响曲。",
    "软件开发者审查代码、修复错误、编写测试并部署服务。", "山上夜里很冷，记得带上外套、手套和保暖的帽子。",
    "翻译需要理解语法、词汇、语气和上下文。", "农民在第一场霜冻前收获了小麦、玉米和土豆。",
    "好老师认真倾听，鼓励好奇心，耐心讲解。", "电动汽车使用电池、电机和充电桩，而不是汽油发动机。",
    "记者采访了目击者，并发表了一篇详细的报道。", "友谊在诚实、善良、信任和共同的经历中成长。",
    "秋天的树叶变黄变红，一片片落在安静的小路上。", "城市的夜晚灯火通明，街道上车来车往。",
    "妈妈包的饺子有白菜猪肉馅，也有韭菜鸡蛋馅。", "长城是中国古代伟大的建筑工程之一。",
]

NAMES = [("twinkle大模型", "ModelScope社区"), ("Twinkle", "ModelScope"), ("小星", "魔搭社区")]


def corpus() -> list[str]:
    """Every line the tokenizer is trained on."""
    lines: list[str] = []
    for s, v, o in itertools.product(EN_SUBJECTS, EN_VERBS, EN_OBJECTS):
        lines.append(f"{s} {v} {o}.")
    for s, v, o in itertools.product(ZH_SUBJECTS, ZH_VERBS, ZH_OBJECTS):
        lines.append(f"{s}{v}{o}。")
    lines += (EN_LINES + ZH_LINES + CODE_LINES + MORE_EN + MORE_ZH) * 4
    lines += [f"<|im_start|>{role}\n" for role in ("system", "user", "assistant", "tool")] * 50
    rows = [json.loads(line) for line in (ASSETS / "self_cognition.jsonl").read_text(encoding="utf-8").splitlines()]
    for i, row in enumerate(rows):
        name, author = NAMES[i % len(NAMES)]
        for text in (row["query"], row["response"]):
            lines.append(text)
            lines.append(text.replace("{{NAME}}", name).replace("{{AUTHOR}}", author))
    return lines


def train_tokenizer(lines: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    # While training, Han characters are also isolated, so a small vocab spends its merges on characters
    # rather than on whole phrases of our data; no merge crosses a Han character, so encoding with the
    # Qwen2 pre-tokenizer saved below gives the same pieces.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{Han}"), behavior="isolated"),
                                                 *_qwen2_pre_tokenizer()])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    tok.pre_tokenizer = pre_tokenizers.Sequence(_qwen2_pre_tokenizer())
    return tok


def _qwen2_pre_tokenizer() -> list:
    """Qwen2's pre-tokenizer: transformers 5 applies it to any tokenizer next to a qwen2 config.json, so ours
    uses it too and the tokenizer encodes the same whether it loads as Qwen2Tokenizer or PreTrainedTokenizerFast."""
    return [
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]


def tokenizer_config() -> dict:
    decoder = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": 2048,
        "padding_side": "right",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def model_config(vocab_size: int) -> dict:
    """A Qwen2 causal LM: hidden 64, 2 layers, 4 heads, 2 kv heads, tied embeddings."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "attention_dropout": 0.0,
        "bos_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
        "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
        "pad_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
        "torch_dtype": "float32",
    }


def main() -> None:
    lines = corpus()
    tok = train_tokenizer(lines)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n")
    (OUT / "config.json").write_text(json.dumps(model_config(tok.get_vocab_size()), indent=2) + "\n")
    print(f"trained on {len(lines)} lines; vocab {tok.get_vocab_size()}; wrote {OUT}")


if __name__ == "__main__":
    main()
