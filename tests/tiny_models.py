"""Small models the tests share (imported by test modules; pytest puts tests/ on the path)."""

import torch
from torch import nn

import alfa
from alfa.layers import dense_matrix
from alfa.models import list_models, register_model
from alfa.truncate import restore_structure


class TinyGazeNet(nn.Module):
    """A small conv net with ResNet-18's stage names (so the layer3/layer4 learning-rate rule applies)."""

    def __init__(self, num_outputs: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        widths = (16, 24, 32, 32)
        cin = 16
        for i, w in enumerate(widths):
            stage = nn.Sequential(nn.Conv2d(cin, w, 3, stride=2 if i else 1, padding=1, bias=False), nn.BatchNorm2d(w))
            setattr(self, f"layer{i + 1}", stage)
            cin = w
        self.fc = nn.Linear(cin, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = torch.relu(stage(x))
        return self.fc(x.mean((2, 3)))


class MicroGazeNet(nn.Module):
    """One convolution and a linear head: the smallest gaze model, for tests whose cost is per operator in the graph
    (ONNX export)."""

    def __init__(self, num_outputs: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv1(x)).mean((2, 3)))


if "micro_gaze_net" not in list_models():

    @register_model
    def micro_gaze_net(num_outputs: int = 2) -> MicroGazeNet:
        """The tests' :class:`MicroGazeNet`, registered so that a checkpoint of it loads."""
        return MicroGazeNet(num_outputs)


if "tiny_gaze_net" not in list_models():

    @register_model
    def tiny_gaze_net(num_outputs: int = 2) -> TinyGazeNet:
        """The tests' :class:`TinyGazeNet`, registered so that a checkpoint of it loads."""
        return TinyGazeNet(num_outputs)


def truncated_tiny_gaze_net(rank: int = 4, seed: int = 0) -> TinyGazeNet:
    """:class:`TinyGazeNet` from ``seed``, in eval mode, truncated at ``rank``: the base most adapter tests share."""
    torch.manual_seed(seed)
    model = TinyGazeNet().eval()
    alfa.truncate(model, rank)
    return model


def truncated_structure(model: nn.Module, rank: int) -> nn.Module:
    """``model`` with the structure ``alfa.truncate(model, rank)`` produces, its factors random (no SVDs: fast), for
    tests whose subject is the structure, not the weights (test_baselines checks that the structures agree)."""
    ranks = {}
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            m, n = dense_matrix(mod).shape
            d = min(rank, m, n)
            if d * (m + n) < m * n:
                ranks[name] = d
    restore_structure(model, ranks)
    return model


def tiny_checkpoints(folder) -> tuple[str, str]:
    """A dense and a truncated tiny_gaze_net saved as checkpoints in ``folder`` (the CLI tests' two bases)."""
    from alfa.checkpoint import save_model

    dense = save_model(folder / "dense.safetensors", alfa.models.create_model("tiny_gaze_net"), "tiny_gaze_net")
    truncated = save_model(folder / "truncated.safetensors", truncated_tiny_gaze_net(), "tiny_gaze_net")
    return str(dense), str(truncated)


def one_error_line(capsys) -> str:
    """What the command wrote on stderr, checked to be one line and no traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err
