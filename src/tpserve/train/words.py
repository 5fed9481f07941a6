"""Word lists for the generated corpus (tool names, arguments, values, word problems)."""

VERBS = tuple("""get set find list create delete update send fetch search book cancel check compute convert
count draw load save open close read write play stop start move copy rename sort filter merge split scan
order schedule reserve lookup translate summarize measure estimate track report notify upload download
register validate approve reject archive restore publish share print render resize encode decode query
refresh reset lock unlock enable disable assign remove add insert replace compare rate review plan map
locate detect predict classify analyze format parse export import sync backup mute pause resume""".split())

NOUNS = tuple("""weather flight hotel table file user order invoice email message song video photo image
account balance payment ticket event meeting calendar task note list report document folder record
price stock quote recipe movie book restaurant route city country station train bus car bike room
device light door alarm timer temperature volume channel playlist contact address phone profile
password session cart product item review rating score game player team match league question answer
word sentence language text number date time zone currency amount unit distance speed weight height
color shape size style font page link site server database query result value key token label tag
category group member role permission project issue branch commit build test release version package
module function variable comment thread post feed story news article topic forecast planet star moon
river mountain lake ocean island forest garden flower tree animal bird fish horse dog cat lesson
course student teacher school grade exam class homework budget expense income tax loan rate plan
goal habit step sleep meal drink coffee tea water sensor signal battery energy power voltage
""".split())

ADJECTIVES = tuple("""red blue green yellow black white small large big tiny fast slow new old hot cold warm
cool dark light bright quiet loud short long high low early late daily weekly monthly yearly public
private local global main extra first last next previous default custom simple full empty open closed
active idle primary secondary north south east west upper lower inner outer soft hard sweet sour
fresh raw safe quick strict loose rich plain""".split())

NAMES = tuple("""Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy Rupert Sybil
Trent Victor Walter Yara Zoe Liam Emma Noah Ava Mia Lucas Ella Leo Nora Omar Priya Ravi Sofia Tom
Uma Wen Xena Yusuf Amir Bea Chen Dara Eli Fatima Gus Hana Ines Jon Kai Lena Marco""".split())

CITIES = tuple("""Paris London Berlin Madrid Rome Tokyo Osaka Seoul Beijing Shanghai Delhi Mumbai Cairo Lagos
Nairobi Lima Quito Bogota Santiago Toronto Vancouver Chicago Boston Denver Austin Seattle Miami Dublin
Oslo Stockholm Helsinki Vienna Prague Warsaw Athens Lisbon Zurich Geneva Sydney Auckland Perth Hanoi
Bangkok Jakarta Manila Istanbul Dubai Doha Riyadh""".split())

OBJECTS = tuple("""apples pencils books marbles cookies stickers cards coins shells stamps eggs oranges
balloons candles cupcakes flowers toys shirts bottles boxes""".split())

# Values that plain-words requests carry into tool arguments, and the words of tool results.
LANGUAGES = tuple("French German Spanish Italian Portuguese Dutch Swedish Polish Greek Turkish Japanese Korean "
                  "Chinese Hindi Arabic Swahili".split())
CURRENCIES = tuple("USD EUR GBP JPY CHF CAD AUD SEK NOK INR BRL MXN".split())
WEEKDAYS = tuple("Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split())
SKIES = tuple("sunny cloudy rainy windy snowy foggy clear stormy".split())
ROOMS = tuple("kitchen bedroom bathroom hallway office garage attic basement".split())
ANIMALS = tuple("Lions Tigers Bears Wolves Eagles Hawks Sharks Falcons Foxes Owls Bulls Rams".split())
FOODS = tuple("rice lentils spinach tomatoes mushrooms chicken tofu potatoes carrots eggs salmon beans "
              "pasta cheese apples lemons".split())
PHRASES = tuple("""see you at noon|the meeting moved to Friday|I am running late|happy birthday|dinner is ready
thanks for the help|call me when you land|the package arrived|good luck tomorrow|the door code is changed
lunch at the usual place|I will bring the cake|practice is cancelled|we won the match|the report is done
pick up milk on the way|welcome to the team|see you next week""".replace("\n", "|").split("|"))
CHORES = tuple("""call the bank|water the plants|pay the rent|take the medicine|walk the dog|buy stamps
send the invoice|book the dentist|charge the phone|feed the cat|renew the passport|back up the laptop
return the library books|order new ink""".replace("\n", "|").split("|"))
