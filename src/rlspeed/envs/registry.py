"""The device-native envs, by Gymnasium id: the one list that `make_env`, the `rlspeed/<id>` Gymnasium views and the
parametrised native-env tests read. A new native env is one file in this package and one line here."""

from __future__ import annotations

from rlspeed.envs.acrobot import Acrobot
from rlspeed.envs.cartpole import CartPole
from rlspeed.envs.mountain_car import MountainCar
from rlspeed.envs.mountain_car_continuous import MountainCarContinuous
from rlspeed.envs.native import NativeEnv
from rlspeed.envs.partial import CartPoleNoVel, PendulumNoVel
from rlspeed.envs.pendulum import Pendulum

#: Device-native implementations, by Gymnasium id.
NATIVE_ENVS: dict[str, type[NativeEnv]] = {
    "CartPole-v1": CartPole,
    "Pendulum-v1": Pendulum,
    "Acrobot-v1": Acrobot,
    "MountainCar-v0": MountainCar,
    "MountainCarContinuous-v0": MountainCarContinuous,
    "CartPoleNoVel-v1": CartPoleNoVel,
    "PendulumNoVel-v1": PendulumNoVel,
}
