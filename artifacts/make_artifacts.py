"""Regenerate the mlcpack demo models and samples in artifacts/.

    .venv/bin/python artifacts/make_artifacts.py

Needs scikit-learn, torch, onnx, onnxruntime, Pillow and numpy. Only this
script needs sklearn/torch; the generated files are plain pickle/ONNX/PNG/npy.

Data: scikit-learn's bundled 8x8 digits (no download), each image scaled from
0..16 to 0..255 and resized to 28x28 (Pillow bilinear) so it looks like MNIST
(white digit on black). Model input = pixel / 255 as float32, no mean/std.
"""

import datetime
import os
import pickle
import random
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "samples")
SEED = 0
NPY_LABELS = (3, 7)  # samples that also get preprocessed .npy inputs
COMMAND = "python artifacts/make_artifacts.py"


def seed_everything(seed=SEED):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_data():
    """Digits upsampled to 28x28 uint8, split 80/20 stratified (seed 0)."""
    digits = load_digits()
    imgs = []
    for im in digits.images:  # 8x8 float, 0..16, ink = high
        small = np.round(im * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
        big = Image.fromarray(small).resize((28, 28), Image.BILINEAR)
        imgs.append(np.asarray(big, dtype=np.uint8))
    imgs = np.stack(imgs)
    labels = digits.target.astype(np.int64)
    return train_test_split(imgs, labels, test_size=0.2, stratify=labels,
                            random_state=SEED)


def to_input(u8):
    return u8.astype(np.float32) / 255.0


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(784, 128)
        self.fc1 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc1(torch.relu(self.fc0(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 7 * 7, 64), nn.ReLU(),
            nn.Linear(64, 10),
            nn.Softmax(dim=1),
        )

    def forward(self, x):
        return self.net(x)


def train(model, x, y, epochs, lr=1e-3, batch=32, softmax_out=False):
    seed_everything()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(SEED)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            out = model(x[idx])
            # The CNN ends in Softmax (as exported); train on log-probs.
            logp = torch.log(out.clamp_min(1e-12)) if softmax_out else out
            loss = (nn.functional.nll_loss(logp, y[idx]) if softmax_out
                    else nn.functional.cross_entropy(logp, y[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model


def torch_outputs(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def export_onnx(model, example, path, out_name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(example),), path,
                          dynamo=False, opset_version=17,
                          input_names=["x"], output_names=[out_name],
                          do_constant_folding=True)
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    for vi in list(m.graph.input) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), f"dynamic dim in {vi.name}"
    for init in m.graph.initializer:
        assert init.data_location != onnx.TensorProto.EXTERNAL, init.name
    assert os.path.getsize(path) < 1_000_000, path
    return m


def onnx_outputs(path, x_each):
    """Run the batch-1 ONNX model over every sample; returns stacked outputs."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": xi[None]})[0] for xi in x_each])


def check_onnx(path, x_each, ref, y):
    got = onnx_outputs(path, x_each)
    # atol 1e-5 plus rtol 1e-5: logits reach |20|, where float32 summation
    # order alone differs by ~1e-5 absolute (~6e-7 relative).
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)
    print(f"{os.path.basename(path)}: max |onnx - torch| = {np.abs(got - ref).max():.2e}")
    acc_t = float((ref.argmax(1) == y).mean())
    acc_o = float((got.argmax(1) == y).mean())
    assert acc_t == acc_o, (path, acc_t, acc_o)
    return got, acc_t, acc_o


def nparams(model):
    return sum(p.numel() for p in model.parameters())


def main():
    torch.set_num_threads(1)  # determinism across machines; tiny models anyway
    xtr_u8, xte_u8, ytr, yte = load_data()
    xtr, xte = to_input(xtr_u8), to_input(xte_u8)

    # ---- MLP 784 -> 128 -> relu -> 10 -------------------------------------
    seed_everything()
    mlp = train(MLP(), xtr.reshape(-1, 784), ytr, epochs=60, lr=1e-3)
    mlp_ref = torch_outputs(mlp, xte.reshape(-1, 784))
    params = {
        "w0": mlp.fc0.weight.detach().numpy().astype(np.float32).copy(),  # [128,784]
        "b0": mlp.fc0.bias.detach().numpy().astype(np.float32).copy(),    # [128]
        "w1": mlp.fc1.weight.detach().numpy().astype(np.float32).copy(),  # [10,128]
        "b1": mlp.fc1.bias.detach().numpy().astype(np.float32).copy(),    # [10]
    }
    with open(os.path.join(HERE, "mlp_params.pkl"), "wb") as f:
        pickle.dump(params, f, protocol=4)
    with open(os.path.join(HERE, "mlp_params.pkl"), "rb") as f:
        p = pickle.load(f)
    np_out = (np.maximum(xte.reshape(-1, 784) @ p["w0"].T + p["b0"], 0)
              @ p["w1"].T + p["b1"])
    np.testing.assert_allclose(np_out, mlp_ref, atol=1e-5, rtol=1e-5)

    mlp_path = os.path.join(HERE, "mlp.onnx")
    mlp_onnx = export_onnx(mlp, xte[:1].reshape(1, 784), mlp_path, "logits")
    mlp_ort, mlp_acc_t, mlp_acc_o = check_onnx(
        mlp_path, xte.reshape(-1, 784), mlp_ref, yte)

    # ---- CNN ----------------------------------------------------------------
    seed_everything()
    cnn = train(CNN(), xtr[:, None], ytr, epochs=40, lr=3e-3, softmax_out=True)
    cnn_ref = torch_outputs(cnn, xte[:, None])
    cnn_path = os.path.join(HERE, "cnn.onnx")
    cnn_onnx = export_onnx(cnn, xte[:1, None], cnn_path, "probs")
    cnn_ort, cnn_acc_t, cnn_acc_o = check_onnx(cnn_path, xte[:, None], cnn_ref, yte)

    # ---- samples: first test image of each class ----------------------------
    os.makedirs(SAMPLES, exist_ok=True)
    sample_rows = []
    for label in range(10):
        i = int(np.flatnonzero(yte == label)[0])
        Image.fromarray(xte_u8[i]).save(
            os.path.join(SAMPLES, f"digit_{label}.png"))
        if label in NPY_LABELS:
            np.save(os.path.join(SAMPLES, f"digit_{label}.npy"),
                    xte[i].reshape(1, 784).astype(np.float32))
            np.save(os.path.join(SAMPLES, f"digit_{label}_cnn.npy"),
                    xte[i].reshape(1, 1, 28, 28).astype(np.float32))
        sample_rows.append((label, i, int(mlp_ort[i].argmax()), int(cnn_ort[i].argmax())))

    with open(os.path.join(HERE, "labels.txt"), "w") as f:
        f.write("".join(f"{d}\n" for d in range(10)))

    # ---- ACCURACY.md -------------------------------------------------------
    n = len(yte)
    lines = [
        "# Demo model accuracy",
        "",
        f"Test set: {n} held-out images (sklearn digits upsampled to 28x28, "
        f"80/20 stratified split, seed {SEED}). Generated {datetime.date.today().isoformat()}.",
        "",
        "| model | file | parameters | torch accuracy | onnxruntime accuracy | test images |",
        "|---|---|---|---|---|---|",
        f"| MLP 784-128-10 | mlp_params.pkl, mlp.onnx | {nparams(mlp)} | "
        f"{mlp_acc_t:.2%} | {mlp_acc_o:.2%} | {n} |",
        f"| CNN | cnn.onnx | {nparams(cnn)} | {cnn_acc_t:.2%} | {cnn_acc_o:.2%} | {n} |",
        "",
        "ONNX outputs match torch within atol 1e-5 + rtol 1e-5 on every test image "
        "(batch 1, onnxruntime CPU).",
        "",
        "## Sample predictions (samples/digit_<label>.png, first test image of each class)",
        "",
        "| label | test index | MLP prediction | CNN prediction |",
        "|---|---|---|---|",
    ]
    for label, i, pm, pc in sample_rows:
        marks = ["" if p == label else " (wrong)" for p in (pm, pc)]
        lines.append(f"| {label} | {i} | {pm}{marks[0]} | {pc}{marks[1]} |")
    lines += ["", "Regenerate with:", "", "```", COMMAND, "```", ""]
    with open(os.path.join(HERE, "ACCURACY.md"), "w") as f:
        f.write("\n".join(lines))

    # ---- summary ------------------------------------------------------------
    print(f"MLP: torch {mlp_acc_t:.4f} onnx {mlp_acc_o:.4f} params {nparams(mlp)}")
    print(f"CNN: torch {cnn_acc_t:.4f} onnx {cnn_acc_o:.4f} params {nparams(cnn)}")
    for name, m in (("mlp.onnx", mlp_onnx), ("cnn.onnx", cnn_onnx)):
        ops = sorted({nd.op_type for nd in m.graph.node})
        opset = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")]
        print(f"{name}: ops {ops} opset {opset}")
    for label, i, pm, pc in sample_rows:
        print(f"digit_{label}: test idx {i} mlp {pm} cnn {pc}")


if __name__ == "__main__":
    main()
